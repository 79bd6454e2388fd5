"""A person's view: headless Chromium (Debian's chromium + chromium-driver) driven by
Selenium signs in, approves a third-party client's consent page and lands on the client's
redirect with a code; a wrong password shows the error. Pages fit a narrow screen.

Skipped, with the reason, where no browser is installed; ``.ci/run`` installs one and sets
TOKENSVC_REQUIRE_BROWSER=1, so in CI a missing browser fails instead. Set
TOKENSVC_SCREENSHOTS_DIR to keep the screenshots (the README's come from ``docs/``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from helpers import CHALLENGE
from service import start_service

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REQUIRED = os.environ.get("TOKENSVC_REQUIRE_BROWSER") == "1"

if not (CHROMIUM and CHROMEDRIVER):
    if REQUIRED:
        raise RuntimeError("TOKENSVC_REQUIRE_BROWSER=1 but chromium/chromedriver are not installed")
    pytest.skip("no headless browser here: apt-get install chromium chromium-driver", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = start_service(tmp_path_factory.mktemp("browser"))
    yield service.base
    service.stop()


@pytest.fixture
def driver(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1100,900"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    browser = webdriver.Chrome(options=options, service=service)
    browser.set_page_load_timeout(20)
    yield browser
    browser.quit()


@pytest.fixture
def shots(tmp_path):
    directory = Path(os.environ.get("TOKENSVC_SCREENSHOTS_DIR") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def authorize_url(base: str) -> str:
    return base + "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": "skyplanner", "redirect_uri": "http://127.0.0.1:2/callback",
        "scope": "read observations:write", "state": "browser-state", "code_challenge": CHALLENGE,
        "code_challenge_method": "S256"})


def wait_for(driver, by, value):
    return WebDriverWait(driver, 10).until(expected_conditions.presence_of_element_located((by, value)))


def fits_the_window(driver) -> bool:
    return driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def sign_in(driver, password: str) -> None:
    wait_for(driver, By.ID, "username").send_keys("alice")
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def test_sign_in_and_approve_a_third_party_client(service, driver, shots):
    driver.get(authorize_url(service))
    wait_for(driver, By.ID, "username")
    assert urlsplit(driver.current_url).path == "/login"
    assert "Sign in" in driver.title
    driver.save_screenshot(str(shots / "login.png"))

    sign_in(driver, "alice-e2e-password")
    allow = wait_for(driver, By.CSS_SELECTOR, "button[value=allow]")
    page = driver.find_element(By.TAG_NAME, "main").text
    assert "SkyPlanner" in page and "Plans your observing nights" in page
    assert "Create and change your observations" in page and "Read your data" in page
    logo = driver.find_element(By.CSS_SELECTOR, "img.logo")
    assert driver.execute_script("return arguments[0].naturalWidth", logo) > 0  # the logo loaded under the CSP
    assert fits_the_window(driver)
    driver.save_screenshot(str(shots / "consent.png"))
    driver.set_window_size(390, 844)  # a phone
    assert fits_the_window(driver)
    driver.save_screenshot(str(shots / "consent-narrow.png"))

    allow.click()
    WebDriverWait(driver, 10).until(lambda d: d.current_url.startswith("http://127.0.0.1:2/callback"))
    query = parse_qs(urlsplit(driver.current_url).query)
    assert query["state"] == ["browser-state"] and len(query["code"][0]) >= 43


def test_wrong_password_shows_the_error(service, driver, shots):
    driver.get(service + "/login")
    sign_in(driver, "not-the-password")
    alert = wait_for(driver, By.CSS_SELECTOR, ".alert")
    assert alert.text == "Wrong username or password."
    assert driver.find_element(By.ID, "username").get_attribute("value") == "alice"
    driver.save_screenshot(str(shots / "login-error.png"))


def test_deny_returns_access_denied(service, driver):
    driver.get(authorize_url(service))
    sign_in(driver, "alice-e2e-password")
    wait_for(driver, By.CSS_SELECTOR, "button[value=deny]").click()
    WebDriverWait(driver, 10).until(lambda d: d.current_url.startswith("http://127.0.0.1:2/callback"))
    assert parse_qs(urlsplit(driver.current_url).query)["error"] == ["access_denied"]

"""A person's view: headless Chromium (Debian's chromium + chromium-driver) driven by Selenium
through every page flow, against the real service started as a process:

- first-party sign-in from signed out, and again when already signed in (no sign-in page);
- third-party consent, allowed and denied; a wrong password, then the right one;
- installation pairing by an operator ("an observatory"), and refused for a user who is not one;
- the account page (connected apps, Remove; an installation listed once paired, Unpair) and sign-out;
- the home page's addresses on a phone, and the page tokensvc login lands on.

Each client's redirect_uri points at a small callback server of the test's own, so every
redirect is really followed by the browser. After each test the browser's console must be
clean: a Content-Security-Policy violation (for example a form post whose redirect the policy
refuses) or any other console error fails the test.

Skipped, with the reason, where no browser is installed; ``.ci/run`` installs one and sets
TOKENSVC_REQUIRE_BROWSER=1, so in CI a missing browser fails instead. Set
TOKENSVC_SCREENSHOTS_DIR to keep the screenshots (the client guide's come from ``docs/``).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
from helpers import CHALLENGE, DEADLINE, VERIFIER
from service import WEBAPP_SECRET, start_service

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REQUIRED = os.environ.get("TOKENSVC_REQUIRE_BROWSER") == "1"

if not (CHROMIUM and CHROMEDRIVER):
    if REQUIRED:
        raise RuntimeError("TOKENSVC_REQUIRE_BROWSER=1 but chromium/chromedriver are not installed")
    pytest.skip("no headless browser here: apt-get install chromium chromium-driver", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

PASSWORDS = {"alice": "violet-tide-anchor", "bob": "copper-fern-meadow", "root": "quartz-river-beacon"}


# A browser app (a public client's page): with the code it received, it runs the rest of the
# flow itself, with fetch, against the service named by the redirect's ``iss``.
BROWSER_APP = """<!doctype html><title>app</title><link rel="icon" href="data:,"><p>received</p>
<pre id="out">running</pre>
<script>
const q = new URLSearchParams(location.search), base = q.get("iss");
async function post(path, fields) {
  const answer = await fetch(base + path, {method: "POST", body: new URLSearchParams(fields)});
  return [answer.status, await answer.json()];
}
(async () => {
  const [exchanged, tokens] = await post("/oauth/token", {grant_type: "authorization_code", code: q.get("code"),
    redirect_uri: location.origin + location.pathname, code_verifier: "VERIFIER", client_id: "skyplanner"});
  const me = await (await fetch(base + "/v1/me", {headers: {Authorization: "Bearer " + tokens.access_token}})).json();
  const [refreshed, renewed] = await post("/oauth/token/refresh",
                                          {refresh_token: tokens.refresh_token, client_id: "skyplanner"});
  const [revoked] = await post("/oauth/token/revoke", {token: renewed.refresh_token, client_id: "skyplanner"});
  document.getElementById("out").textContent =
    JSON.stringify({exchanged, me: me.username, refreshed, renewed: Boolean(renewed.access_token), revoked});
})().catch(error => { document.getElementById("out").textContent = "failed: " + error; });
</script>"""


# A page of another origin that sends a signed-in browser where it likes: navigating it
# (``/navigate?to=URL``), or posting a form of its own making (``/post?to=URL&field=value...``),
# as any page an administrator happens to open could.
NAVIGATE = """<!doctype html><title>elsewhere</title><link rel="icon" href="data:,"><p>elsewhere</p>
<script>location.replace(new URLSearchParams(location.search).get("to"));</script>"""
POST = """<!doctype html><title>elsewhere</title><link rel="icon" href="data:,"><p>elsewhere</p>
<form method="post" id="f"></form>
<script>
const q = new URLSearchParams(location.search), form = document.getElementById("f");
form.action = q.get("to");
for (const [name, value] of q) if (name !== "to") {
  const input = document.createElement("input"); input.type = "hidden"; input.name = name; input.value = value;
  form.appendChild(input);
}
form.submit();
</script>"""


# Double-clickjacking: a page of another origin asks for a double click on a button placed where
# the one-click page's Continue will be (``/double-click?x=...&y=...&to=URL``); the first click
# (its mousedown) sends the browser to ``to``, and the second lands on whatever appears there.
DOUBLE_CLICK = """<!doctype html><title>a game</title><link rel="icon" href="data:,"><p>Double-click the button</p>
<button id="b" style="position:absolute;transform:translate(-50%,-50%);width:160px;height:60px">Double-click me</button>
<script>
const q = new URLSearchParams(location.search), button = document.getElementById("b");
button.style.left = q.get("x") + "px"; button.style.top = q.get("y") + "px";
button.addEventListener("mousedown", () => { location.href = q.get("to"); }, {once: true});
</script>"""


# A two-step lure: a page of another origin asks for a click on its button
# (``/two-clicks?x=...&y=...&to=URL&code=...``), whose mousedown sends the browser to ``to``, and
# for another click at the same place a moment later, when "the next screen" is there: where
# Continue then is. It shows a "confirmation code" of its own, as a lure hoping to be typed.
TWO_CLICKS = """<!doctype html><title>a game</title><link rel="icon" href="data:,">
<p>Click the button, then click again at the same place when the next screen appears.</p>
<p>Your code: <strong id="code"></strong></p>
<button id="b" style="position:absolute;transform:translate(-50%,-50%);width:160px;height:60px">Click me</button>
<script>
const q = new URLSearchParams(location.search), button = document.getElementById("b");
button.style.left = q.get("x") + "px"; button.style.top = q.get("y") + "px";
document.getElementById("code").textContent = q.get("code");
button.addEventListener("mousedown", () => { location.href = q.get("to"); }, {once: true});
</script>"""


class CallbackPage(http.server.BaseHTTPRequestHandler):
    """A client's redirect target: a plain page that names what it received; with
    ``state=app``, the browser app above; at ``/navigate``, ``/post``, ``/double-click`` and
    ``/two-clicks``, a page of another origin that sends the browser on (above)."""

    def do_GET(self) -> None:
        body = b'<!doctype html><title>callback</title><link rel="icon" href="data:,"><p>received</p>'
        path = urlsplit(self.path).path
        if parse_qs(urlsplit(self.path).query).get("state") == ["app"]:
            body = BROWSER_APP.replace("VERIFIER", VERIFIER).encode()
        elif path in ("/navigate", "/post", "/double-click", "/two-clicks"):
            body = {"/navigate": NAVIGATE, "/post": POST, "/double-click": DOUBLE_CLICK,
                    "/two-clicks": TWO_CLICKS}[path].encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def page_server():
    """A small page server of the test's own (CallbackPage), in a thread: its origin, then stopped."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CallbackPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def callback():
    yield from page_server()


# An installation of the kind that takes "an", paired and unpaired by a test of its own; an
# administrator, for tokensvc login.
EXTRA = '''
[[installations]]
installation_id = "hilltop-dome"
name = "Hilltop observatory"
kind = "observatory"
operators = ["alice"]

[[users]]
username = "root"
password = "{root}"
admin = true
'''.format(root=PASSWORDS["root"])


@pytest.fixture(scope="module")
def running(tmp_path_factory, callback):
    service = start_service(tmp_path_factory.mktemp("browser"), callback=callback, extra=EXTRA)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def service(running):
    return running.base


def chromium_options(profile: Path) -> webdriver.ChromeOptions:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1100,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    """One Chromium for a module's tests: starting one costs seconds of CPU, a fresh state
    (``driver``) a few milliseconds."""
    browser = start_browser(chromium_options(tmp_path_factory.mktemp("profile")))
    try:
        yield browser
    finally:
        browser.quit()


def forget_everything(browser) -> None:
    """The state a fresh profile starts with: one blank window of the usual size, no cookie, no
    stored data, nothing cached, and nothing left in the console's log."""
    for handle in browser.window_handles[1:]:
        browser.switch_to.window(handle)
        browser.close()
    browser.switch_to.window(browser.window_handles[0])
    browser.get("about:blank")
    browser.execute_cdp_cmd("Network.clearBrowserCookies", {})
    browser.execute_cdp_cmd("Network.clearBrowserCache", {})
    browser.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": "*", "storageTypes": "all"})
    browser.set_window_size(1100, 900)
    browser.set_page_load_timeout(20)
    browser.get_log("browser")
    browser.expected_console = []  # see assert_clean_console


@pytest.fixture
def driver(chromium):
    forget_everything(chromium)
    yield chromium
    assert_clean_console(chromium)


def start_browser(options, attempts: int = 3):
    """Chromium under chromedriver; a chromedriver that exits while starting on a busy machine
    (status 1 before it listens) is started again, up to ``attempts`` times."""
    for attempt in range(attempts):
        try:
            return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
        except WebDriverException:
            if attempt == attempts - 1:
                raise


def assert_clean_console(driver) -> None:
    """No console error and no Content-Security-Policy report, at any level.

    Chromium also reports a document's own 4xx status as an error; a test that causes one on
    purpose (the 401 of a wrong password) names it in ``driver.expected_console``, and it must
    then appear."""
    bad = [entry["message"] for entry in driver.get_log("browser")
           if entry["level"] == "SEVERE" or "Content Security Policy" in entry["message"]]
    for expected in driver.expected_console:
        found = [message for message in bad if expected in message]
        assert found, f"expected the console to report {expected!r}; it reported {bad}"
        bad.remove(found[0])
    assert not bad, "the browser's console reported:\n" + "\n".join(bad)


@pytest.fixture
def shots(tmp_path):
    directory = Path(os.environ.get("TOKENSVC_SCREENSHOTS_DIR") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def authorize_url(base: str, callback: str, client_id: str, scope: str, **extra: str) -> str:
    return base + "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": f"{callback}/{client_id}",
        "scope": scope, "state": "browser-state", "code_challenge": CHALLENGE,
        "code_challenge_method": "S256", **extra})


def sky_url(service: str, callback: str) -> str:
    return authorize_url(service, callback, "skyplanner", "read observations:write")


def wait_until(driver, condition):
    """Wait for ``condition(driver)``; an element that goes stale as a page navigates is no error
    (Chromium says so as a stale reference, or as a node that no longer belongs to the document)."""

    def settled(d):
        try:
            return condition(d)
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return False
            raise

    return WebDriverWait(driver, DEADLINE, ignored_exceptions=[StaleElementReferenceException]).until(settled)


def wait_for(driver, by, value):
    return wait_until(driver, expected_conditions.presence_of_element_located((by, value)))


def decision(driver, value: str = "allow"):
    """A decision's button once it has appeared and takes clicks: the page shows its buttons a
    moment after it appears (handlers/edge/pace.py), as a person reads it first."""
    button = wait_for(driver, By.CSS_SELECTOR, f"form.decision button[value={value}]")
    wait_until(driver, lambda d: d.execute_script(
        "const style = getComputedStyle(arguments[0]); return style.visibility === 'visible' && style.opacity === '1'",
        button))
    return button


def landed_on(driver, url: str) -> dict[str, list[str]]:
    """Wait until the browser shows ``url`` (the client's callback); its query."""
    wait_until(driver, lambda d: d.current_url.startswith(url + "?"))
    wait_until(driver, lambda d: d.find_element(By.TAG_NAME, "p").text == "received")  # the page itself loaded
    return parse_qs(urlsplit(driver.current_url).query)


def chips_whole(driver) -> bool:
    """Every scope chip (``observations:write``) stands on one line: none is broken mid-word."""
    return driver.execute_script(
        "return [...document.querySelectorAll('code.scope')].every(c => c.getClientRects().length === 1)")


def fits_the_window(driver) -> bool:
    return driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def sign_in(driver, password: str, username: str = "alice") -> None:
    field = wait_for(driver, By.ID, "username")
    field.clear()
    field.send_keys(username)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button[type=submit]").click()


def sign_in_directly(driver, service: str, username: str = "alice") -> None:
    driver.get(service + "/login")
    sign_in(driver, PASSWORDS[username], username)
    wait_until(driver, lambda d: urlsplit(d.current_url).path == "/")


def exchange(service: str, code: str, client_id: str, callback: str) -> dict:
    response = requests.post(service + "/oauth/token", data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": f"{callback}/{client_id}",
        "code_verifier": VERIFIER, "client_id": client_id}, auth=(client_id, WEBAPP_SECRET)
        if client_id == "webapp" else None)
    assert response.status_code == 200, response.text
    return response.json()


def introspect(service: str, token: str) -> dict:
    return requests.post(service + "/oauth/token/introspect", data={"token": token},
                         auth=("webapp", WEBAPP_SECRET)).json()


# -- sign-in ---------------------------------------------------------------------------


def test_first_party_sign_in_from_signed_out_reaches_the_client(service, callback, driver, shots):
    driver.get(authorize_url(service, callback, "webapp", "read write"))
    wait_for(driver, By.ID, "username")
    assert urlsplit(driver.current_url).path == "/login"
    assert "Sign in" in driver.title
    assert "to continue to Web app" in driver.find_element(By.TAG_NAME, "main").text
    driver.save_screenshot(str(shots / "login.png"))

    sign_in(driver, PASSWORDS["alice"])
    query = landed_on(driver, f"{callback}/webapp")
    assert query["state"] == ["browser-state"] and query["iss"] == [service]
    tokens = exchange(service, query["code"][0], "webapp", callback)
    assert introspect(service, tokens["access_token"])["username"] == "alice"


def test_already_signed_in_goes_straight_to_the_client(service, callback, driver):
    sign_in_directly(driver, service)
    driver.get(authorize_url(service, callback, "webapp", "read"))
    query = landed_on(driver, f"{callback}/webapp")  # no sign-in page on the way
    assert query["state"] == ["browser-state"] and len(query["code"][0]) >= 43


def test_wrong_password_then_right_one(service, callback, driver, shots):
    driver.get(authorize_url(service, callback, "webapp", "read"))
    sign_in(driver, "not-the-password")
    driver.expected_console.append("/login - Failed to load resource: the server responded with a status of 401")
    alert = wait_for(driver, By.CSS_SELECTOR, ".alert")
    assert alert.text == "Wrong username or password."
    assert driver.find_element(By.ID, "username").get_attribute("value") == "alice"
    # The focus follows the error; a browser applies autofocus at its next rendering step, not at load.
    wait_until(driver, lambda d: d.switch_to.active_element.get_attribute("id") == "password")
    assert "to continue to Web app" in driver.find_element(By.TAG_NAME, "main").text
    driver.save_screenshot(str(shots / "login-error.png"))

    driver.find_element(By.ID, "password").send_keys(PASSWORDS["alice"])
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button[type=submit]").click()
    assert "code" in landed_on(driver, f"{callback}/webapp")


# -- third-party consent ----------------------------------------------------------------


def test_sign_in_and_approve_a_third_party_client(service, callback, driver, shots):
    driver.get(sky_url(service, callback))
    assert "to continue to SkyPlanner" in wait_for(driver, By.TAG_NAME, "main").text
    sign_in(driver, PASSWORDS["alice"])
    allow = decision(driver, "allow")
    page = driver.find_element(By.TAG_NAME, "main").text
    assert "SkyPlanner" in page and "Plans your observing nights" in page
    assert "Create and change your observations" in page and "Read your data" in page
    logo = driver.find_element(By.CSS_SELECTOR, "img.logo")
    assert driver.execute_script("return arguments[0].naturalWidth", logo) > 0  # the logo loaded under the CSP
    link = driver.find_element(By.LINK_TEXT, "account page")
    assert urlsplit(link.get_attribute("href")).path == "/account"
    assert "Not alice?" in page
    assert fits_the_window(driver) and chips_whole(driver)
    driver.save_screenshot(str(shots / "consent.png"))
    driver.set_window_size(375, 812)  # a phone
    assert fits_the_window(driver) and chips_whole(driver)
    driver.save_screenshot(str(shots / "consent-narrow.png"))

    allow.click()
    query = landed_on(driver, f"{callback}/skyplanner")
    assert query["state"] == ["browser-state"] and len(query["code"][0]) >= 43


def test_deny_returns_access_denied(service, callback, driver):
    driver.get(sky_url(service, callback))
    sign_in(driver, PASSWORDS["alice"])
    decision(driver, "deny").click()
    query = landed_on(driver, f"{callback}/skyplanner")
    assert query["error"] == ["access_denied"] and "code" not in query


# -- installation pairing ---------------------------------------------------------------


def pairing_url(service: str, callback: str) -> str:
    return authorize_url(service, callback, "node-agent", "read write", installation_id="backyard-scope")


def test_an_operator_pairs_an_installation(service, callback, driver, shots):
    driver.get(pairing_url(service, callback))
    sign_in(driver, PASSWORDS["alice"])
    pair = decision(driver, "allow")  # the first-party agent names it first
    page = driver.find_element(By.TAG_NAME, "main").text
    assert "Pair Backyard telescope" in page and "a telescope" in page and "Node installation agent" in page
    assert "Read this installation's data" in page and "your data" not in page
    driver.save_screenshot(str(shots / "pairing.png"))
    pair.click()
    query = landed_on(driver, f"{callback}/node-agent")
    tokens = exchange(service, query["code"][0], "node-agent", callback)
    info = introspect(service, tokens["access_token"])
    assert info["subject_type"] == "installation" and info["installation_id"] == "backyard-scope"


def test_pairing_is_refused_to_a_user_who_is_not_an_operator(service, callback, driver):
    driver.get(pairing_url(service, callback))
    sign_in(driver, PASSWORDS["bob"], "bob")
    query = landed_on(driver, f"{callback}/node-agent")
    assert query["error"] == ["access_denied"] and "code" not in query


# -- the account page and sign-out ------------------------------------------------------


def test_account_page_lists_connected_apps_and_removes_one(service, callback, driver, shots):
    driver.get(service + "/account")  # signed out: sign in, then back
    sign_in(driver, PASSWORDS["alice"])
    wait_until(driver, lambda d: urlsplit(d.current_url).path == "/account")

    driver.get(sky_url(service, callback))  # connect SkyPlanner, and hold its tokens
    decision(driver, "allow").click()
    tokens = exchange(service, landed_on(driver, f"{callback}/skyplanner")["code"][0], "skyplanner", callback)
    assert introspect(service, tokens["refresh_token"])["active"] is True

    driver.get(service + "/")
    driver.find_element(By.PARTIAL_LINK_TEXT, "connected apps").click()
    app = wait_for(driver, By.CSS_SELECTOR, "li.item[data-client-id=skyplanner]")
    text = app.text
    assert "SkyPlanner" in text and "Connected since" in text
    assert "Read your data" in text and "observations:write" in text
    logo = app.find_element(By.CSS_SELECTOR, "img.logo")
    assert driver.execute_script("return arguments[0].naturalWidth", logo) > 0
    assert "alice" in driver.find_element(By.TAG_NAME, "h1").text
    assert "this browser" in driver.find_element(By.ID, "sessions").find_element(By.XPATH, "following-sibling::ul").text
    assert fits_the_window(driver) and chips_whole(driver)
    driver.save_screenshot(str(shots / "account.png"))
    driver.set_window_size(375, 812)
    assert fits_the_window(driver) and chips_whole(driver)
    driver.save_screenshot(str(shots / "account-narrow.png"))

    app.find_element(By.CSS_SELECTOR, "[aria-label='Remove SkyPlanner']").click()  # asks first
    confirm = wait_for(driver, By.CSS_SELECTOR, "form.confirm button[name=client_id]")
    assert "Remove SkyPlanner?" in driver.find_element(By.CSS_SELECTOR, "form.confirm").text
    assert introspect(service, tokens["refresh_token"])["active"] is True  # nothing happened yet
    confirm.click()
    wait_until(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, "li.item[data-client-id=skyplanner]"))
    assert urlsplit(driver.current_url).path == "/account"
    assert "SkyPlanner no longer has access to your account." in driver.find_element(By.CSS_SELECTOR, ".note").text
    for token in (tokens["access_token"], tokens["refresh_token"]):
        assert introspect(service, token) == {"active": False}


def test_sign_out_ends_the_session(service, callback, driver):
    sign_in_directly(driver, service)
    driver.get(service + "/account")
    wait_for(driver, By.CSS_SELECTOR, "form[action='/logout'] button").click()
    wait_until(driver, lambda d: "You are signed out" in d.find_element(By.TAG_NAME, "h1").text)
    driver.get(service + "/account")
    wait_for(driver, By.ID, "username")
    assert urlsplit(driver.current_url).path == "/login"
    driver.get(authorize_url(service, callback, "webapp", "read"))  # signed out: asked to sign in again
    wait_for(driver, By.ID, "username")
    assert urlsplit(driver.current_url).path == "/login"


def test_favicon_is_served_to_pages_and_json_alike(service, driver):
    driver.get(service + "/oauth/clients")  # a JSON body: the browser asks for /favicon.ico
    assert "skyplanner" in driver.find_element(By.TAG_NAME, "body").text
    driver.get(service + "/favicon.ico")
    icon = wait_for(driver, By.TAG_NAME, "img")
    assert driver.execute_script("return arguments[0].naturalWidth", icon) == 32
    driver.get(service + "/")  # a page names its own icon
    href = driver.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
    assert requests.get(href).headers["Content-Type"] == "image/svg+xml"


@pytest.fixture(scope="module")
def ipv6_callback():
    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    server = Server(("::1", 0), CallbackPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://[::1]:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def native_service(tmp_path_factory, callback, ipv6_callback):
    """A service with a native app whose loopback redirect is on IPv6 (RFC 8252 §7.3)."""
    service = start_service(tmp_path_factory.mktemp("native"), callback=callback, extra=f"""
[[clients]]
client_id = "native-app"
name = "Native app"
redirect_uris = ["{ipv6_callback}/native-app"]
allowed_scopes = ["read"]
""")
    yield service.base
    service.stop()


def test_consent_leads_on_to_an_ipv6_loopback_redirect(native_service, ipv6_callback, driver):
    """CSP has no expression for [::1], so the consent form's form-action names its scheme:
    the browser follows the redirect to the native app with a clean console."""
    sign_in_directly(driver, native_service)
    driver.get(authorize_url(native_service, ipv6_callback, "native-app", "read"))
    decision(driver, "allow").click()
    query = landed_on(driver, f"{ipv6_callback}/native-app")
    assert query["state"] == ["browser-state"] and query["code"]



@pytest.fixture(scope="module")
def stranger():
    """A page server whose origin no client registered."""
    yield from page_server()


def app_result(driver) -> str:
    wait_until(driver, lambda d: d.find_element(By.ID, "out").text != "running")
    return driver.find_element(By.ID, "out").text


def test_a_browser_app_runs_the_whole_flow_with_fetch(service, callback, driver):
    """A public client's page (its redirect URI's origin) exchanges its code, calls /v1/me with
    the token, refreshes and revokes, all with fetch across origins (CORS), console clean."""
    sign_in_directly(driver, service)
    driver.get(authorize_url(service, callback, "skyplanner", "read", state="app"))
    decision(driver, "allow").click()
    landed_on(driver, f"{callback}/skyplanner")
    assert json.loads(app_result(driver)) == {"exchanged": 200, "me": "alice", "refreshed": 200, "renewed": True,
                                              "revoked": 200}


def test_a_page_of_another_origin_is_refused_by_the_browser(service, stranger, driver):
    driver.get(f"{stranger}/skyplanner?" + urlencode({"code": "x", "state": "app", "iss": service}))
    assert app_result(driver).startswith("failed: TypeError")
    driver.expected_console = ["blocked by CORS policy", "/oauth/token - Failed to load resource: net::ERR_FAILED"]


# -- pages for people ---------------------------------------------------------------------


@pytest.mark.parametrize("path,title,status", [("/nope", "Nothing here", 404),
                                               ("/oauth/token", "Not a page to open", 405)])
def test_a_browser_gets_a_page_for_an_address_that_is_not_one(service, driver, path, title, status):
    driver.get(service + path)
    assert wait_for(driver, By.TAG_NAME, "h1").text == title  # once, and in plain words
    assert driver.find_element(By.LINK_TEXT, "Go to the home page")
    assert "detail" not in driver.find_element(By.TAG_NAME, "body").text  # not the API's JSON
    driver.expected_console = [f"the server responded with a status of {status}"]
    assert requests.get(service + path).headers["Content-Type"] == "application/json"  # an API caller's shape


def test_a_form_left_open_past_its_token_is_shown_again(service, callback, driver):
    driver.get(sky_url(service, callback))
    sign_in(driver, PASSWORDS["alice"])
    decision(driver, "allow")
    driver.delete_cookie("_xsrf")  # as across a restart with a new secret, or a sign-out in another tab
    decision(driver, "allow").click()
    alert = wait_for(driver, By.CSS_SELECTOR, ".alert")
    assert alert.text == "This form had expired. Please decide again."
    driver.expected_console = ["/oauth/authorize - Failed to load resource: the server responded with a status of 403"]
    decision(driver, "allow").click()  # the form again, with a new token
    assert "code" in landed_on(driver, f"{callback}/skyplanner")


def test_not_alice_switches_account_and_returns_to_the_same_request(service, callback, driver):
    driver.get(sky_url(service, callback))
    sign_in(driver, PASSWORDS["alice"])
    wait_for(driver, By.CSS_SELECTOR, "button.link").click()  # "Not alice? Switch account"
    wait_for(driver, By.ID, "username")
    assert "to continue to SkyPlanner" in driver.find_element(By.TAG_NAME, "main").text
    sign_in(driver, PASSWORDS["bob"], "bob")
    decision(driver, "allow")
    assert "your account bob" in driver.find_element(By.TAG_NAME, "main").text


def test_the_sign_in_page_says_who_is_signed_in(service, driver):
    sign_in_directly(driver, service)
    driver.get(service + "/login")
    assert "You are signed in as alice." in wait_for(driver, By.CSS_SELECTOR, ".note").text


def test_signing_out_lands_on_a_page_of_its_own(service, driver):
    """Sign-out answers its form with a redirect: the page shown came from a GET, so Back and
    reload never offer to post the form again."""
    sign_in_directly(driver, service)
    driver.get(service + "/account")
    wait_for(driver, By.CSS_SELECTOR, "form[action='/logout'] button").click()
    wait_until(driver, lambda d: "You are signed out" in d.find_element(By.TAG_NAME, "h1").text)
    assert urlsplit(driver.current_url).path == "/logout"
    driver.refresh()  # no resubmission: still just the page
    assert "You are signed out" in wait_for(driver, By.TAG_NAME, "h1").text


# -- the account page: sessions and installations -------------------------------------------


def test_the_other_sessions_are_listed_and_signed_out(service, driver):
    other = requests.Session()  # alice, signed in elsewhere
    other.headers["User-Agent"] = "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:130.0) Gecko/20100101 Firefox/130.0"
    other.get(service + "/login")
    signed_in = other.post(service + "/login", data={"username": "alice", "password": PASSWORDS["alice"],
                                                     "_xsrf": other.cookies["_xsrf"]}, allow_redirects=False)
    assert signed_in.status_code == 302
    sign_in_directly(driver, service)
    driver.get(service + "/account#sessions")
    listed = wait_for(driver, By.XPATH, "//h2[@id='sessions']/following-sibling::ul[1]").text
    assert "Firefox on Windows" in listed and "this browser" in listed
    driver.find_element(By.CSS_SELECTOR, "button[value=end-others]").click()
    note = wait_for(driver, By.CSS_SELECTOR, ".note").text
    assert note.startswith("Signed out of") and "other session" in note
    assert other.get(service + "/v1/me").status_code == 401  # that browser is signed out
    assert "Firefox" not in driver.find_element(By.XPATH, "//h2[@id='sessions']/following-sibling::ul[1]").text


def test_the_account_lists_an_installation_once_paired_and_unpair_takes_it_away(service, callback, driver):
    sign_in_directly(driver, service)
    driver.get(service + "/account")
    wait_for(driver, By.ID, "sessions")
    assert not driver.find_elements(By.CSS_SELECTOR, "li.item[data-installation-id=hilltop-dome]")  # never paired
    driver.get(authorize_url(service, callback, "node-agent", "read", installation_id="hilltop-dome"))
    pair = decision(driver, "allow")
    assert "an observatory, with Node installation agent" in driver.find_element(By.TAG_NAME, "main").text
    pair.click()
    tokens = exchange(service, landed_on(driver, f"{callback}/node-agent")["code"][0], "node-agent", callback)
    driver.get(service + "/account#installations")
    item = wait_for(driver, By.CSS_SELECTOR, "li.item[data-installation-id=hilltop-dome]")
    assert "Hilltop observatory" in item.text and "An observatory" in item.text
    item.find_element(By.CSS_SELECTOR, "[aria-label='Unpair Hilltop observatory']").click()
    wait_for(driver, By.CSS_SELECTOR, "form.confirm button[name=installation_id]").click()
    assert "Hilltop observatory is unpaired" in wait_for(driver, By.CSS_SELECTOR, ".note").text
    assert not driver.find_elements(By.CSS_SELECTOR, "li.item[data-installation-id=hilltop-dome]")
    assert introspect(service, tokens["refresh_token"]) == {"active": False}


# -- native apps: the one-click page, and no code for a page of another origin -----------------


class Listener(http.server.ThreadingHTTPServer):
    """Whatever listens on a loopback port (any local process could): it keeps every request
    that reaches it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        listener = self

        class Keep(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                listener.seen.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Keep)


@pytest.fixture
def listener():
    server = Listener()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def cli_url(service: str, redirect_uri: str) -> str:
    return service + "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": "tokensvc-cli", "redirect_uri": redirect_uri, "scope": "admin",
        "state": "s", "code_challenge": CHALLENGE, "code_challenge_method": "S256"})


def test_a_page_of_another_origin_gets_no_code_for_a_signed_in_admin(service, stranger, listener, driver):
    """A page elsewhere (another port of 127.0.0.1: same site, another origin) sends a signed-in
    administrator's browser to the command line's authorization with a loopback port of its
    own: the browser stops at the one-click page, and a form the page posts itself is refused.
    Nothing reaches the port."""
    sign_in_directly(driver, service, "root")
    port = listener.server_address[1]
    target = cli_url(service, f"http://127.0.0.1:{port}/callback")
    driver.get(f"{stranger}/navigate?" + urlencode({"to": target}))
    wait_until(driver, lambda d: d.find_element(By.TAG_NAME, "h1").text == "Continue to tokensvc command line?")
    assert urlsplit(driver.current_url).path == "/oauth/authorize"
    main = driver.find_element(By.TAG_NAME, "main").text
    assert f"tokensvc command line on this computer, port {port}" in main and "admin" in main
    fields = {field.get_attribute("name"): field.get_attribute("value")
              for field in driver.find_elements(By.CSS_SELECTOR, "form.decision input[type=hidden]")}
    # The page elsewhere reads neither the token in the form (another origin's document) nor the
    # cookie: cookies are not kept apart by port, but the _xsrf cookie is HttpOnly.
    fields.pop("_xsrf")
    driver.get(f"{stranger}/page")
    wait_until(driver, lambda d: d.find_element(By.TAG_NAME, "p").text == "received")
    assert "_xsrf" not in driver.execute_script("return document.cookie")
    driver.get(f"{stranger}/post?" + urlencode({"to": service + "/oauth/authorize", **fields, "decision": "allow"}))
    alert = wait_for(driver, By.CSS_SELECTOR, ".alert")  # the page again, and nothing decided
    assert "decide again" in alert.text and urlsplit(driver.current_url).path == "/oauth/authorize"
    driver.expected_console = ["/oauth/authorize - Failed to load resource: the server responded with a status of 403"]
    assert listener.seen == []


def one_line(driver, element) -> bool:
    """Whether ``element``'s text stands on one line (a code broken over two is misread)."""
    return driver.execute_script("const r = document.createRange(); r.selectNodeContents(arguments[0]);"
                                 "return r.getClientRects().length === 1", element)


def shown_code(driver) -> str:
    """The confirmation code the page shows, as a person reads it."""
    return driver.find_element(By.CSS_SELECTOR, ".confirmation .code code").text


def test_the_command_lines_sign_in_is_one_click(service, callback, driver, shots):
    """tokensvc login's page in a browser: signed in, the confirmation code to type into the
    command line shown large and whole (on a phone too), one click on Continue, and the code
    lands on the command line's loopback port (form-action lets the form lead there), console
    clean. The code shown redeems it."""
    redirect = f"{callback}/callback"
    driver.get(cli_url(service, redirect))
    sign_in(driver, PASSWORDS["root"], "root")
    carry_on = decision(driver, "allow")
    assert carry_on.text == "Continue"
    port = urlsplit(callback).port
    main = driver.find_element(By.TAG_NAME, "main").text
    assert f"tokensvc command line on this computer, port {port}" in main
    assert "Type this code where tokensvc command line asks for it, then choose Continue:" in main
    code = driver.find_element(By.CSS_SELECTOR, ".confirmation .code code")
    assert re.fullmatch(r"[0-9A-Z]{4}-[0-9A-Z]{4}", code.text) and code.rect["height"] >= 36  # large
    assert one_line(driver, code)
    assert fits_the_window(driver) and chips_whole(driver)
    driver.save_screenshot(str(shots / "confirm.png"))
    typed = shown_code(driver)
    driver.set_window_size(375, 812)
    assert fits_the_window(driver) and one_line(driver, code)
    driver.set_window_size(1100, 900)
    decision(driver, "allow").click()
    query = landed_on(driver, redirect)
    assert query["state"] == ["s"] and query["code"]
    tokens = requests.post(service + "/oauth/token", data={
        "grant_type": "authorization_code", "code": query["code"][0], "redirect_uri": redirect,
        "code_verifier": VERIFIER, "client_id": "tokensvc-cli", "confirmation_code": typed}, timeout=30)
    assert tokens.status_code == 200 and tokens.json()["scope"] == "admin"


def click_at(driver, x: int, y: int, count: int) -> None:
    """A press and release of the left button at (x, y), the ``count``-th click of a series (2: a
    double click's second), as the input device sends them (CDP ``Input.dispatchMouseEvent``)."""
    for kind in ("mousePressed", "mouseReleased"):
        driver.execute_cdp_cmd("Input.dispatchMouseEvent",
                               {"type": kind, "x": x, "y": y, "button": "left", "clickCount": count})


WATCH_SUBMIT = "window.submitted = false; addEventListener('submit', () => { window.submitted = true; }, true);"
SINCE_RESPONSE = "return performance.now() - performance.getEntriesByType('navigation')[0].responseEnd;"


def test_a_double_click_elsewhere_gets_no_code_and_a_persons_click_does(service, stranger, listener, driver):
    """Double-clickjacking, as it was done: a page of another origin asks a signed-in
    administrator for a double click where the one-click page's Continue will be; the first
    click sends the browser to the command line's authorization (a loopback port of the page's
    own), and the second lands where Continue appears. Continue appears, and takes clicks, only
    after a moment, so that click lands on nothing and nothing reaches the port; then a click at
    a person's pace, once Continue is there, sends the code on."""
    sign_in_directly(driver, service, "root")
    target = cli_url(service, f"http://127.0.0.1:{listener.server_address[1]}/callback")
    driver.get(target)  # where Continue appears is the same for everyone at this size: the page knows it
    box = driver.execute_script("const r = arguments[0].getBoundingClientRect();"
                                "return [Math.round(r.x + r.width / 2), Math.round(r.y + r.height / 2)];",
                                decision(driver, "allow"))
    for _ in range(5):  # until the second click lands within the moment (a busy machine may be slower)
        driver.get(f"{stranger}/double-click?" + urlencode({"x": box[0], "y": box[1], "to": target}))
        wait_for(driver, By.ID, "b")
        click_at(driver, *box, count=1)  # its mousedown sends the browser on
        wait_until(driver, lambda d: urlsplit(d.current_url).path == "/oauth/authorize"
                   and d.execute_script("return document.readyState") != "loading")
        driver.execute_script(WATCH_SUBMIT)
        since = driver.execute_script(SINCE_RESPONSE)
        click_at(driver, *box, count=2)  # the double click's second half, on the one-click page
        if since < 500:
            break
    else:
        pytest.fail("the second click never came within half a second of the page (too busy a machine)")
    assert driver.execute_script("return window.submitted") is False  # the click met no button
    assert urlsplit(driver.current_url).path == "/oauth/authorize" and listener.seen == []
    decision(driver, "allow").click()  # a person, once Continue is there
    wait_until(driver, lambda d: listener.seen)
    assert len(listener.seen) == 1 and parse_qs(urlsplit(listener.seen[0]).query)["code"]


def attacker_exchange(service: str, listener, code: str, confirmation: str | None) -> requests.Response:
    """What the program on the listener's port does with a code it received: exchanges it with
    the verifier of the challenge it wrote into the request, and whatever confirmation it has."""
    return requests.post(service + "/oauth/token", timeout=30, data={
        "grant_type": "authorization_code", "code": code, "code_verifier": VERIFIER, "client_id": "tokensvc-cli",
        "redirect_uri": f"http://127.0.0.1:{listener.server_address[1]}/callback",
        **({"confirmation_code": confirmation} if confirmation is not None else {})})


@pytest.mark.parametrize("gap", [1, 2, 3])
def test_a_two_click_lure_elsewhere_gets_no_admin(service, stranger, listener, driver, gap):
    """The two-step lure: a page of another origin asks a signed-in administrator for a click
    (which opens the command line's authorization, with a loopback port and PKCE challenge of
    the page's own) and for another one ``gap`` seconds later at the same place, where
    Continue then is; it shows a "confirmation code" of its own. The second click is taken and
    the code reaches the port, but the program there never saw the page: exchanged without a
    confirmation, or with the lure's, it gives nothing (before: 200 and scope admin). The code
    the page showed the person, which only they saw, is what redeems it."""
    import secrets
    import time

    sign_in_directly(driver, service, "root")
    target = cli_url(service, f"http://127.0.0.1:{listener.server_address[1]}/callback")
    driver.get(target)  # where Continue appears is the same for everyone at this size: the page knows it
    box = driver.execute_script("const r = arguments[0].getBoundingClientRect();"
                                "return [Math.round(r.x + r.width / 2), Math.round(r.y + r.height / 2)];",
                                decision(driver, "allow"))
    lures = "".join(secrets.choice("0123456789ABCDEFGHJKMNPQRSTVWXYZ") for _ in range(8))
    lures = f"{lures[:4]}-{lures[4:]}"
    for _ in range(5):  # until the second click lands on Continue (a busy machine may load the page later)
        driver.get(f"{stranger}/two-clicks?" + urlencode({"x": box[0], "y": box[1], "to": target, "code": lures}))
        assert wait_for(driver, By.ID, "code").text == lures
        first = time.monotonic()
        click_at(driver, *box, count=1)  # its mousedown sends the browser on
        wait_until(driver, lambda d: urlsplit(d.current_url).path == "/oauth/authorize")
        time.sleep(max(0.0, first + gap - time.monotonic()))
        click_at(driver, *box, count=1)  # the second click, where Continue is now
        try:
            WebDriverWait(driver, 10).until(lambda d: listener.seen)
            break
        except TimeoutException:
            continue
    else:
        pytest.fail(f"the second click, {gap} s after the first, never landed on Continue (too busy a machine)")
    assert len(listener.seen) == 1
    code = parse_qs(urlsplit(listener.seen[0]).query)["code"][0]
    for confirmation in (None, lures):
        refused = attacker_exchange(service, listener, code, confirmation)
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant", refused.text
        assert "access_token" not in refused.text
    answered = attacker_exchange(service, listener, code, shown_code(driver))  # the person's, off the page
    assert answered.status_code == 200 and answered.json()["scope"] == "admin"


def test_not_alice_switches_account_on_the_pairing_page_too(service, callback, driver):
    driver.get(pairing_url(service, callback))
    sign_in(driver, PASSWORDS["alice"])
    decision(driver, "allow")
    driver.find_element(By.CSS_SELECTOR, "button.link").click()  # "Not alice? Switch account"
    sign_in(driver, PASSWORDS["bob"], "bob")  # bob operates nothing: the node software is told so
    query = landed_on(driver, f"{callback}/node-agent")
    assert query["error"] == ["access_denied"] and "code" not in query


def breaks_only_after_a_slash(driver) -> bool:
    """Every endpoint address on the home page wraps, if it wraps, only after a "/" or a space:
    each character that starts a new line follows one."""
    return driver.execute_script("""
      return [...document.querySelectorAll('.endpoints code')].every(code => {
        const text = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
        let top = null, before = null;
        for (let node = text.nextNode(); node; node = text.nextNode()) {
          for (let i = 0; i < node.length; i++) {
            const range = document.createRange();
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            const box = range.getClientRects()[0];
            if (!box) continue;
            if (top !== null && box.top > top + 1 && before !== '/' && before !== ' ') return false;
            top = box.top;
            before = node.data[i];
          }
        }
        return true;
      })""")


def test_the_home_pages_addresses_wrap_only_after_a_slash_on_a_phone(service, driver):
    driver.set_window_size(375, 812)
    driver.get(service + "/")
    wait_for(driver, By.CSS_SELECTOR, ".endpoints code")
    wrapped = driver.execute_script(
        "return [...document.querySelectorAll('.endpoints code')].filter(c => c.getClientRects().length > 1).length")
    assert wrapped >= 1  # the phone is narrow enough that some address must wrap
    assert breaks_only_after_a_slash(driver) and fits_the_window(driver)


def test_tokensvc_login_lands_on_a_page_in_the_services_look(running, driver, tmp_path, monkeypatch):
    """tokensvc login end to end in Chromium: signed in, the confirmation code the page shows
    typed where the command line reads it, one click, and the command line's loopback page in
    the service's look; the command line keeps an admin's refresh token."""
    import queue

    from tokensvc.cli import main as cli

    opened: queue.Queue[str] = queue.Queue()
    credentials = tmp_path / "credentials.json"
    monkeypatch.setenv("TOKENSVC_CREDENTIALS", str(credentials))
    monkeypatch.setattr("webbrowser.open", opened.put)
    reading, typing = (os.fdopen(end, mode) for end, mode in zip(os.pipe(), ("r", "w"), strict=True))
    monkeypatch.setattr("sys.stdin", reading)  # what --confirmation-stdin reads
    code: list[int] = []
    login = threading.Thread(target=lambda: code.append(cli.main(["login", "--url", running.admin,
                                                                  "--confirmation-stdin", "--json"])))
    login.start()
    driver.get(opened.get(timeout=30))
    sign_in(driver, PASSWORDS["root"], "root")
    carry_on = decision(driver, "allow")
    typing.write(shown_code(driver) + "\n")  # the person types what the page shows
    typing.close()
    carry_on.click()  # then the one click
    # "Signed in", or, when the command line had not read the code yet, where to type it.
    wait_until(driver, lambda d: d.title in ("Signed in · tokensvc", "Type the code in the command line · tokensvc"))
    card = driver.find_element(By.TAG_NAME, "main")
    assert "go back to the command line" in card.text or "where the command line asks for it" in card.text
    style = driver.execute_script("const s = getComputedStyle(arguments[0]); return [s.backgroundColor, "
                                  "s.borderRadius, s.maxWidth]", card)
    assert style == ["rgb(255, 255, 255)", "12px", "440px"]  # the card of the service's pages
    login.join(30)
    assert code == [0]
    assert json.loads(credentials.read_text())[running.admin]["client_id"] == "tokensvc-cli"

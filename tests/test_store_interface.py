"""The Store contract as written (storage/base.py): every method says who calls it, and each
module it names does call it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from backends import contract_methods

PACKAGE = Path(__file__).resolve().parent.parent / "tokensvc"


def test_every_method_of_the_contract_says_who_calls_it_and_each_module_named_does():
    methods = contract_methods()
    assert len(methods) > 40
    for name, method in methods.items():
        doc = inspect.getdoc(method) or ""
        assert "Called by " in doc, name
        callers = " ".join(doc.split("Called by ", 1)[1].split())
        modules = re.findall(r"[\w/]+\.py", callers)
        assert modules, (name, callers)
        for module in modules:
            source = (PACKAGE / module).read_text()
            assert re.search(rf"\.{name}\(", source), (name, module)

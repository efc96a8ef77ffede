"""The package faces load their names on first use (laser/lazy.py): a light module imports without torch,
and every exported name is the object it names, never a submodule of the same name."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest


@pytest.mark.parametrize("package", ["laser", "laser.vllm"])
def test_every_exported_name_is_its_object_even_after_its_namesake_module_loads(package):
    face = importlib.import_module(package)
    for name in face.__all__:
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            importlib.import_module(f"{package}.{name}")  # sets the package's attribute of that name
        assert not isinstance(getattr(face, name), ModuleType), f"{package}.{name} is a module"


def test_a_light_module_imports_without_torch():
    code = "import sys, laser, laser.vllm.requirements, laser.vllm.request_args; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_submodule_is_read_as_an_attribute_and_an_unknown_name_is_an_attribute_error():
    import laser

    assert isinstance(laser.defaults, ModuleType) and laser.defaults.N_MAX >= 1
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = laser.nope

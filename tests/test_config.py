"""minicomp.config: every MINICOMP_* switch declared once, read from the environment at each access,
overridable for a block, and checked (a bad value names the variable and what it takes)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from minicomp import config

ROOT = Path(__file__).resolve().parent.parent / "minicomp"


def test_every_switch_read_in_the_source_is_declared_and_read_through_config():
    declared = {s.env for s in config.SETTINGS.values() if s.env}
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        code = re.sub(r"``[^`]*``", "", text)  # what docstrings quote is not a read
        if path.name != "config.py":
            assert not re.search(r"environ(\.get)?\(?\[?[\"']MINICOMP_", code), f"{path}: read it through config"
            assert "torch.backends" not in code and "get_float32_matmul_precision" not in code, \
                f"{path}: a torch global read while compiling belongs in config (so it is keyed)"
        for name in re.findall(r"MINICOMP_[A-Z_]+", text):
            assert name in declared, f"{path}: {name} is not declared in config"


@pytest.mark.parametrize("name", [n for n, s in config.SETTINGS.items() if s.env])
def test_defaults_and_environment(name, monkeypatch):
    setting = config.SETTINGS[name]
    monkeypatch.delenv(setting.env, raising=False)
    default = setting.default() if callable(setting.default) else setting.default
    assert config.get(name) == default
    monkeypatch.setenv(setting.env, "")  # empty: the default
    assert config.get(name) == default
    if setting.kind == "bool":
        monkeypatch.setenv(setting.env, "0")
        assert getattr(config, name) is False
        monkeypatch.setenv(setting.env, "1")
        assert getattr(config, name) is True
    elif setting.kind == "choice":
        for choice in setting.choices:
            monkeypatch.setenv(setting.env, choice)
            assert getattr(config, name) == choice


@pytest.mark.parametrize("name", [n for n, s in config.SETTINGS.items() if s.kind in ("bool", "choice")])
def test_an_invalid_value_names_the_switch_and_the_allowed_values(name, monkeypatch):
    setting = config.SETTINGS[name]
    monkeypatch.setenv(setting.env, "foo")
    with pytest.raises(config.ConfigError, match=f"{setting.env}='foo': expected one of") as error:
        getattr(config, name)
    assert all(choice in str(error.value) for choice in setting.choices or ("0", "1"))


def test_an_invalid_switch_is_an_error_for_the_user_not_a_fallback(monkeypatch):
    import minicomp
    monkeypatch.setenv("MINICOMP_CONV", "foo")
    with pytest.raises(Exception, match="MINICOMP_CONV='foo': expected one of auto, cudnn, ir"):  # Dynamo wraps it
        minicomp.compile(lambda x: x + 1)(torch.randn(3))


def test_patch_overrides_for_a_block_and_restores(monkeypatch):
    monkeypatch.setenv("MINICOMP_CONV", "cudnn")
    before = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    with config.patch(conv="ir", poison=True, cuda_matmul_allow_tf32=True):
        assert (config.conv, config.poison, config.cuda_matmul_allow_tf32) == ("ir", True, True)
        assert torch.backends.cuda.matmul.allow_tf32  # a torch global is set in torch: eager agrees
        with config.patch(conv="auto"):
            assert config.conv == "auto"
        assert config.conv == "ir"
    assert config.conv == "cudnn" and (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == before
    with pytest.raises(config.ConfigError, match="no setting"):
        with config.patch(convolution="ir"):
            pass
    with pytest.raises(config.ConfigError, match="expected one of"):
        with config.patch(memory_plan="all"):
            pass


def test_fingerprint_covers_exactly_the_codegen_settings():
    base = config.fingerprint()
    for name, setting in config.SETTINGS.items():
        value = config.get(name)
        other = not value if isinstance(value, bool) else \
            next((c for c in setting.choices if c != value), None) if setting.choices else "elsewhere"
        with config.patch(**{name: other}):
            assert (config.fingerprint() != base) == setting.codegen, name
    assert config.fingerprint() == base

"""The dump folder as a user reads it (issue 44): inputs named as the model names them, passes that
changed nothing marked, no notes meant for minicomp's developers, and a folder named from its graph."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn

import minicomp
from minicomp.frontend.fallback_reasons import DELIBERATE_FALLBACKS
from minicomp.frontend.input_names import _from_placeholder, _from_source

# Words of an issue tracker or a to-do list: a note for minicomp's developers, not for its users.
INTERNAL_NOTE = re.compile(r"\bissue\b|\bTODO\b|\bFIXME\b|\bXXX\b|\bhack\b", re.IGNORECASE)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return torch.softmax(self.head(self.features(x).flatten(1)), -1)


def _dump_inference(model, x, folder: Path) -> Path:
    """Compile ``model`` for inference with dumps in ``folder``; check it against eager; the graph's
    dump folder."""
    with torch.no_grad():
        out = minicomp.compile(model, dump_dir=str(folder))(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    (graph,) = folder.iterdir()
    return graph


def _header_names(text: str) -> dict[str, str]:
    """The dump's inputs header: IR name -> the user's name."""
    rows = re.findall(r"^#   (arg\d+)\s+\S+\s+(.+)$", text, re.MULTILINE)
    return dict(rows)


def test_inputs_are_named_as_the_model_names_them(tmp_path):
    model = ConvNet().eval()
    graph = _dump_inference(model, torch.randn(2, 3, 4, 4), tmp_path)
    expected = {name for name, _ in model.named_parameters()} | {"x", "features.1.running_mean",
                                                                    "features.1.running_var"}
    for file in ["fx_graph.py", "00_lowered.txt", "program.txt"]:
        names = _header_names((graph / file).read_text())
        assert set(names.values()) == expected, (file, names)
    lowered = (graph / "00_lowered.txt").read_text()
    for ir_name, user in _header_names(lowered).items():  # the header's argN are the IR's inputs
        assert re.search(rf"= input .* {ir_name} strides", lowered), (ir_name, user)
    full = [f for f in graph.glob("[0-9][0-9]_*.txt") if not f.read_text().startswith("unchanged from")]
    assert all(_header_names(f.read_text()) == _header_names(lowered) for f in full)


def test_a_backward_names_the_inputs_its_forward_saved(tmp_path):
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))

    def loss_fn(x):
        return model(x).square().mean()
    x = torch.randn(3, 4)
    minicomp.compile(loss_fn, dump_dir=str(tmp_path))(x).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_fn(x).backward()
    for got, want in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    forward, = tmp_path.glob("loss_fn_forward_*")
    backward, = tmp_path.glob("loss_fn_backward_*")
    assert set(_header_names((forward / "00_lowered.txt").read_text()).values()) == {
        "x", "model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"}
    backward_names = _header_names((backward / "00_lowered.txt").read_text()).values()
    assert "x" in backward_names and "incoming gradient of one of the forward's outputs" in backward_names


def test_placeholder_and_source_names():
    assert _from_source("L['self']._modules['features']._modules['0']._parameters['weight']") == "features.0.weight"
    assert _from_source("L['fn']._modules['1']._buffers['running_mean']") == "1.running_mean"
    assert _from_source("G['model']._modules['head']._parameters['bias']") == "model.head.bias"
    assert _from_source("L['x']") == "x"
    assert _from_placeholder("l_self_modules_l1_parameters_weight_") == "l1.weight"
    assert _from_placeholder("l_x_") == "x"


def test_a_pass_that_changed_nothing_is_one_line_naming_the_ir_it_left(tmp_path):
    graph = _dump_inference(ConvNet().eval(), torch.randn(2, 3, 4, 4), tmp_path)
    summary = (graph / "summary.txt").read_text()
    changed = re.search(r"^passes that changed the IR: (.*)$", summary, re.MULTILINE).group(1).split(", ")
    unchanged = re.search(r"^passes that left it as it was: (.*)$", summary, re.MULTILINE).group(1).split(", ")
    assert "cse" in unchanged and "fusion" in changed  # no repeated subexpression here; fusion always acts
    files = sorted(f for f in graph.glob("[0-9][0-9]_*.txt") if f.name != "00_lowered.txt")
    assert sorted(f.name[3:-4] for f in files) == sorted(changed + unchanged)
    last_full = graph / "00_lowered.txt"
    for f in files:
        text = f.read_text()
        if f.name[3:-4] in unchanged:
            assert text == f"unchanged from {last_full.name}\n", f.name
        else:
            assert text != last_full.read_text(), f"{f.name} is a copy of {last_full.name}"
            last_full = f


def test_dumps_and_fallback_reasons_hold_no_developer_notes(tmp_path):
    graph = _dump_inference(ConvNet().eval(), torch.randn(2, 3, 4, 4), tmp_path)
    assert "convolution" in (graph / "00_lowered.txt").read_text()  # a fallback reason is in the dump
    for f in graph.iterdir():
        if f.suffix in (".txt", ".py"):
            assert not INTERNAL_NOTE.search(f.read_text()), (f.name, INTERNAL_NOTE.search(f.read_text()))
    for op, reason in DELIBERATE_FALLBACKS.items():
        assert not INTERNAL_NOTE.search(reason), (op, reason)


def _scale(x):
    return torch.relu(x) * 2 + 1


def test_folders_are_named_from_the_graph_and_unique_in_a_process(tmp_path):
    x = torch.randn(8)
    for _ in range(2):  # the same graph twice: two folders, the second with _2
        torch._dynamo.reset()
        torch.testing.assert_close(minicomp.compile(_scale, dump_dir=str(tmp_path))(x), _scale(x))
    first, second = sorted(p.name for p in tmp_path.iterdir())
    assert re.fullmatch(r"_scale_inference_[0-9a-f]{8}", first), first
    assert second == f"{first}_2"


STABLE_SCRIPT = """
import sys, torch, minicomp
def _scale(x):
    return torch.relu(x) * 2 + 1
minicomp.compile(_scale, dump_dir=sys.argv[1])(torch.randn(8))
"""


def test_a_folder_name_is_the_same_in_another_process(tmp_path):
    minicomp.compile(_scale, dump_dir=str(tmp_path / "here"))(torch.randn(8))
    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "script.py"  # a file: code given by -c has no source lines, so no stack traces
    script.write_text(STABLE_SCRIPT)
    subprocess.run([sys.executable, str(script), str(tmp_path / "there")], check=True, cwd=root,
                   env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True)
    assert [p.name for p in (tmp_path / "here").iterdir()] == [p.name for p in (tmp_path / "there").iterdir()]

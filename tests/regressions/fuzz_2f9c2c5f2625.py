# A minimal program on which minicomp differed from eager, found and shrunk by
# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,
# unfixed bug, set XFAIL = "<reason>" to expect the failure (strictly).
#
# Failure when saved:
#   AssertionError: whole graph fell back: compile: AttributeError: 'bool' object has no attribute 'expr'
#   assert (139956380269712 in {139956379384272, 139956380741584, 139956383599376, 139956384881296, 139956387790480, 139956389255312, ...} or "compile: AttributeError: 'bool' object has no attribute 'expr'" is None)
#    +  where 139956380269712 = id(Report(graph='graph1971_backward', kernels=[], fallbacks=[], decisions=[], whole_graph_fallback="compile: AttributeErr..., from_cache=False, cuda_graph=None, collectives=[], fx_ops=[], node_origins={}, input_names={}, externs=[], passes={}))
#    +  and   "compile: AttributeError: 'bool' object has no attribute 'expr'" = Report(graph='graph1971_backward', kernels=[], fallbacks=[], decisions=[], whole_graph_fallback="compile: AttributeErr..., from_cache=False, cuda_graph=None, collectives=[], fx_ops=[], node_origins={}, input_names={}, externs=[], passes={}).whole_graph_fallback
GRADIENTS = True  # a failure of the backward: replayed with check_gradients_against_eager
import torch


def f(v0):
    v1 = v0[..., 1:]
    v2 = torch.where(v1 > 0, v1, v1)
    return v2


def make_inputs():
    torch.manual_seed(0)
    return [
        torch.randn(0, 3),  # v0: float32 [0, 3] contiguous
    ]


if __name__ == "__main__":
    from tests.test_fuzz import check_gradients_against_eager
    check_gradients_against_eager(f, make_inputs)
    print("minicomp's outputs and gradients match eager's")

"""The contract every registered task keeps (a new task is checked here without a test of its own):
shapes with D = d + outputs, the same seed gives the same prompts, a member sampled inside an
ensemble equals its task sampled alone, and no tensor is made from host data inside ``sample``
after a warm-up call (on CUDA that is a host-to-device copy, which a captured graph forbids)."""

import pytest
import torch

import iclnb.engine.train  # noqa: F401  (imports every module that registers a task: TASKS is complete)
from iclnb.engine.tasks import TASKS, Task, make_task, sample_members

D_, N_ = 3, 7
# every registered task at its defaults, and the non-default paths of their samplers
CASES = [(name, {}) for name in sorted(TASKS)] + [
    ("linear_regression", {"rho": 0.5}),
    ("lipschitz", {"rank": 2, "subspace_seed": 1, "function": "quadratic", "rho": 0.5, "covariates": "gaussian"}),
    ("multitask", {"supports": ((1,), (2, 3), (1, 3)), "sigma2": 0.0}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in p.items()) for name, p in CASES]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtype(name, params, dtype):
    t = make_task(name, D_, N_, **params)
    assert isinstance(t, Task) and t.name == name
    T = t.outputs  # read from the instance
    p = t.sample(5, _gen(0), "cpu", dtype)
    assert p.Z.shape == (5, N_, D_ + T) and p.xq.shape == (5, D_)
    assert p.yq.shape == ((5,) if T == 1 else (5, T))
    assert p.Z.dtype == p.xq.dtype == p.yq.dtype == dtype
    assert torch.isfinite(p.Z).all() and torch.isfinite(p.yq).all()


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_same_seed_same_prompts(name, params):
    t = make_task(name, D_, N_, **params)
    a, b, c = (t.sample(6, _gen(s)) for s in (1, 1, 2))
    assert torch.equal(a.Z, b.Z) and torch.equal(a.xq, b.xq) and torch.equal(a.yq, b.yq)
    assert not torch.equal(a.Z, c.Z)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_member_in_an_ensemble_equals_alone(name, params):
    t = make_task(name, D_, N_, **params)
    tasks = [t, t.with_n(N_), t]
    p = sample_members(tasks, 4, [_gen(10 + k) for k in range(3)], "cpu", torch.float32)
    assert p.Z.shape[:2] == (3, 4)
    for k, tk in enumerate(tasks):
        alone = tk.sample(4, _gen(10 + k))
        assert torch.equal(p.Z[k], alone.Z) and torch.equal(p.xq[k], alone.xq) and torch.equal(p.yq[k], alone.yq)


def test_every_registered_task_is_covered():
    assert {name for name, _ in CASES} == set(TASKS)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_no_tensor_from_host_data_after_warm_up(name, params, monkeypatch):
    """After one call, ``sample`` (and ``sample_many``) build no tensor from Python or numpy data:
    constants come from ``iclnb.engine.tasks.constant``, made during the warm-up (the CUDA-graph rule)."""
    t = make_task(name, D_, N_, **params)
    tasks = [t, t]
    t.sample(4, _gen(0))
    sample_members(tasks, 4, [_gen(1), _gen(2)], "cpu", torch.float32)

    def forbidden(*args, **kwargs):
        raise AssertionError(f"{name}.sample made a tensor from host data after the warm-up")

    for fn in ("tensor", "as_tensor", "from_numpy"):
        monkeypatch.setattr(torch, fn, forbidden)
    t.sample(4, _gen(0))
    sample_members(tasks, 4, [_gen(1), _gen(2)], "cpu", torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_sample_is_captured_in_a_cuda_graph(name, params):
    """On CUDA, a warmed-up ``sample_members`` is captured in a graph as the engine captures its
    step (iclnb.engine.train.cuda_graph_capture), and replays."""
    from iclnb.engine.train import cuda_graph_capture

    t = make_task(name, D_, N_, **params)
    tasks = [t, t]
    g = [torch.Generator(device="cuda").manual_seed(s) for s in (1, 2)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the eager warm-up builds the constants
        sample_members(tasks, 4, g, "cuda", torch.float32)
    torch.cuda.current_stream().wait_stream(side)
    out = {}
    replay = cuda_graph_capture(lambda: out.update(p=sample_members(tasks, 4, g, "cuda", torch.float32)), g)
    replay()
    torch.cuda.synchronize()
    assert out["p"].Z.shape == (2, 4, N_, D_ + t.outputs) and torch.isfinite(out["p"].Z).all()

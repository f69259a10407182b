import pytest
import torch

from iclnb.engine.util import (
    Prefetch,
    check_int,
    check_ints,
    check_real,
    check_reals,
    derive_seed,
    dtype_name,
    generator,
    prefetch_enabled,
    resolve_device,
    resolve_dtype,
)


def test_derive_seed_is_stable_distinct_and_independent_across_seeds():
    assert derive_seed(0, "data") == derive_seed(0, "data") and 0 <= derive_seed(0, "data") < 2**63
    streams = {derive_seed(s, "init", i) for s in range(3) for i in range(3)}
    assert len(streams) == 9  # seed 0's init 1 is not seed 1's init 0 (no seed + i overlap)
    assert derive_seed(0, "data") != derive_seed(0, "init") != derive_seed(0)
    a, b = generator(1, "x"), generator(1, "x")
    assert torch.equal(torch.randn(3, generator=a), torch.randn(3, generator=b))
    with pytest.raises(ValueError, match="^seed=-1.*allowed"):
        derive_seed(-1)


def test_checks_name_value_and_range():
    check_int("n", 3, 1)
    check_real("lr", 0.1, strict=True)
    assert check_ints("ns", (1, 2), 1) == [1, 2] and check_reals("Rs", [4], 4.0) == [4.0]
    for fn, args, name in ((check_int, ("n", 0, 1), "n"), (check_int, ("n", 2.5, 1), "n"),
                           (check_int, ("n", True, 0), "n"),
                           (check_real, ("lr", 0.0, 0.0, True), "lr"), (check_real, ("s", float("nan")), "s"),
                           (check_ints, ("ns", [], 1), "ns"), (check_reals, ("Rs", [3.0], 4.0), "Rs")):
        with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
            fn(*args)


def test_devices_and_dtypes():
    assert resolve_device("auto").type in ("cpu", "cuda") and resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("float64") is torch.float64 and dtype_name(torch.float32) == "float32"
    with pytest.raises(ValueError, match="^device="):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda'"):
            resolve_device("cuda")


def test_prefetch_keeps_the_order_raises_the_drawing_error_and_stops():
    calls = iter(range(100))

    def draw():
        i = next(calls)
        if i == 5:
            raise KeyError("draw 5")
        return torch.full((3,), float(i))

    with Prefetch(draw, depth=2) as feed:
        assert [float(feed()[0]) for _ in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]
        with pytest.raises(KeyError, match="draw 5"):
            feed()
    assert not feed._thread.is_alive()
    with Prefetch(lambda: torch.zeros(1)) as idle:  # closed while its thread waits on a full queue
        idle()
    assert not idle._thread.is_alive()
    closed = Prefetch(draw)
    closed.close()
    with pytest.raises(RuntimeError, match="after close"):
        closed()


def test_prefetch_policy(monkeypatch):
    for value, on in (("1", True), ("0", False)):
        monkeypatch.setenv("ICLNB_PREFETCH", value)
        assert prefetch_enabled() is on
    monkeypatch.setenv("ICLNB_PREFETCH", "yes")
    with pytest.raises(ValueError, match="ICLNB_PREFETCH"):
        prefetch_enabled()

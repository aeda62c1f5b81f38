"""The rule for a call of ``jax.distributed.initialize`` after phalanx's (launch/jaxinit.py), on a
stand-in for JAX's state; the real one is tests/differential/test_contracts.py's."""

from __future__ import annotations

import pytest

from phalanx.launch.jaxinit import guard, phalanx_values

ENV = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3",
       "PHALANX_NPROC_PER_NODE": "2", "LOCAL_RANK": "1"}


class State:
    """JAX's ``State`` in what matters here: one client, a second ``initialize`` refused."""

    def __init__(self) -> None:
        self.client: object = None
        self.calls: list[tuple] = []

    def initialize(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.client is not None:
            raise RuntimeError("distributed.initialize should only be called once.")
        self.client = object()


def test_phalanx_values_come_from_its_variables():
    assert phalanx_values(ENV) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3,
                                   "cluster_detection_method": "deactivate", "local_device_ids": [1]}
    one_per_node = {**ENV, "PHALANX_NPROC_PER_NODE": "1"}
    assert "local_device_ids" not in phalanx_values(one_per_node)


def test_a_later_call_for_the_same_processes_is_a_no_op_any_other_gets_jaxs_error():
    state = State()
    used = phalanx_values(ENV)
    state.initialize(**used)
    state.initialize = guard(state, used)
    for args, kwargs in [((), {}), (("10.0.0.1:1234", 4, 3), {}), ((None,), {"num_processes": 4}),
                         (("elsewhere:99",), {"process_id": 3, "local_device_ids": 1}),
                         ((), {"initialization_timeout": 60, "local_device_ids": [1]})]:
        assert state.initialize(*args, **kwargs) is None
    assert len(state.calls) == 1  # only phalanx's reached JAX
    for args, kwargs, asked in [(("10.0.0.1:1234", 2, 1), {}, "num_processes=2, process_id=1"),
                                ((), {"process_id": 0}, "process_id=0"), ((), {"local_device_ids": [0]}, "local_device_ids=[0]")]:
        with pytest.raises(RuntimeError, match="should only be called once") as caught:
            state.initialize(*args, **kwargs)
        assert caught.value.__notes__ == [
            f"phalanx initialized jax.distributed before the script (--framework jax) as process 3 of 4 at "
            f"10.0.0.1:1234; this call asks for {asked}"]
    state.client = None  # jax.distributed.shutdown(): JAX's own again
    state.initialize("x:1", 2, 0)
    assert state.calls[-1] == (("x:1", 2, 0), {}) and state.client is not None

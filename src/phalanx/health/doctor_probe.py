"""The doctor's node side: ``python -m phalanx.health.doctor_probe [--node-only] [--burn S]``.

It runs on a node as a job's process would (started by the job's backend, one per node) and
checks what that node would give a job:

- the devices it sees (GPUs through torch, else the CPU), and each GPU's health through NVML
  when ``nvidia-ml-py`` and a driver are there (uncorrected ECC errors, rows that failed to
  remap, pages waiting to be retired, clocks held back by heat or power);
- a matmul burn on every device, for its rate and its correctness (the result against a
  float64 reference, and repeated identical matmuls against each other: a device that
  computes wrong numbers is worse than a slow one);
- the free space of the working directory's filesystem and of ``/dev/shm``;
- its clock.

It prints one line, ``PHALANX_DOCTOR_NODE {json}`` (``checks.NodeReport``), which the rank logs
carry back from any backend. With ``--node-only`` (the check before an attempt,
``--health-check``) it then judges the node by itself, prints the findings and exits 1 when the
node is bad. Otherwise, in a job of several nodes, it goes on to the links between nodes
(``doctor_links.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import threading
import time
from typing import Any

from .checks import FINDING_TAG, REPORT_TAG, DeviceReport, NodeReport, judge_node

# NVML's clock event reasons that mean trouble (the others, idle or an application cap, are normal).
THROTTLE = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
            0x80: "power brake"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m phalanx.health.doctor_probe")
    parser.add_argument("--burn", type=float, default=2.0, help="seconds of matmul per device")
    parser.add_argument("--node-only", action="store_true", help="this node alone: judge it, exit 1 when it is bad")
    parser.add_argument("--link-mb", type=float, default=0.0, help="all-reduce size for bandwidth (default: 64 on GPUs, 8 on CPUs)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the other nodes")
    args = parser.parse_args(argv)
    report = check_node(args.burn)
    print(REPORT_TAG + json.dumps(report.to_dict(), sort_keys=True), flush=True)
    if args.node_only:
        findings = judge_node(report)
        for finding in findings:
            print(f"{FINDING_TAG}{finding.severity}: {finding.check}: {finding.message}", flush=True)
        sys.exit(1 if any(f.severity == "bad" for f in findings) else 0)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and report.error is None:
        from .doctor_links import run_links

        run_links(report, args.link_mb, args.timeout)


def check_node(burn: float) -> NodeReport:
    started = time.monotonic()
    node_rank = int(os.environ.get("PHALANX_NODE_RANK", os.environ.get("GROUP_RANK", "0")) or 0)
    nproc = int(os.environ.get("PHALANX_NPROC_PER_NODE", "1") or 1)
    where = os.getcwd()
    disk = _usage(where)
    shm = _usage("/dev/shm")
    common: dict[str, Any] = dict(node_rank=node_rank, hostname=socket.gethostname(), nproc_per_node=nproc,
                                  disk_path=where, disk_free=disk[0], disk_total=disk[1], shm_free=shm[0], shm_total=shm[1])
    try:
        import torch
    except ImportError:
        return NodeReport(**common, error="torch is not installed on this node", clock=time.time())
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    counters, nvml = _nvml(torch, gpus)
    if gpus:
        devices = burn_all([("cuda", i) for i in range(gpus)], burn, torch)
        devices = [DeviceReport(d.index, d.kind, d.name, d.gflops, d.burn_ok, d.error, counters.get(d.index, {}))
                   for d in devices]
    else:
        devices = burn_all([("cpu", 0)], burn, torch)
    return NodeReport(**common, devices=tuple(devices), gpus_visible=gpus, nvml=nvml, clock=time.time(),
                      seconds=time.monotonic() - started)


def _usage(path: str) -> tuple[int | None, int | None]:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None, None
    return usage.free, usage.total


# -- the burn -----------------------------------------------------------------------------------


def burn_all(devices: list[tuple[str, int]], seconds: float, torch: Any) -> list[DeviceReport]:
    """Every device at once (a thread each: torch releases the GIL in matmul), as a job loads them."""
    results: dict[int, DeviceReport] = {}

    def one(kind: str, index: int) -> None:
        try:
            results[index] = burn(kind, index, seconds, torch)
        except Exception as exc:  # noqa: BLE001 - a device that cannot compute is the finding
            results[index] = DeviceReport(index, kind, _device_name(kind, index, torch), error=f"raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=d, daemon=True) for d in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[index] for _, index in devices]


def burn(kind: str, index: int, seconds: float, torch: Any) -> DeviceReport:
    """Matmuls on one device for ``seconds``: its rate (GFLOP/s), and whether it computes right."""
    device = torch.device(kind, index) if kind == "cuda" else torch.device("cpu")
    name = _device_name(kind, index, torch)
    wrong = _check_arithmetic(device, torch)
    if wrong:
        return DeviceReport(index, kind, name, error=wrong)
    n, dtype = (8192, torch.bfloat16) if kind == "cuda" else (384, torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(1234 + index)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    first = a @ b
    _sync(kind, device, torch)
    count, started = 0, time.perf_counter()
    last = first
    while True:
        for _ in range(4):
            last = a @ b
        count += 4
        _sync(kind, device, torch)
        took = time.perf_counter() - started
        if took >= seconds:
            break
    gflops = 2.0 * n**3 * count / took / 1e9
    if not bool(torch.isfinite(last).all()):
        return DeviceReport(index, kind, name, gflops, error="gave NaN or inf from finite inputs")
    # Identical matmuls should agree (cuBLAS and the CPU's BLAS are repeatable up to rounding
    # in the order of their sums); a flipped bit or a bad core shows far beyond that.
    scale = float(first.float().abs().max()) or 1.0
    if float((first.float() - last.float()).abs().max()) > 1e-2 * scale:
        return DeviceReport(index, kind, name, gflops, error="gave different results for the same matmul")
    return DeviceReport(index, kind, name, gflops, burn_ok=True)


def _check_arithmetic(device: Any, torch: Any) -> str | None:
    """A float32 matmul on the device against float64 on the CPU (small, exact enough to tell)."""
    gen = torch.Generator(device="cpu").manual_seed(7)
    a = torch.randn(256, 256, generator=gen, dtype=torch.float64)
    b = torch.randn(256, 256, generator=gen, dtype=torch.float64)
    want = a @ b
    got = (a.float().to(device) @ b.float().to(device)).double().cpu()
    # float32 (TF32 on some GPUs: 10 mantissa bits) over 256 terms of N(0,1) products
    error = float((got - want).abs().max())
    return None if error < 0.5 else f"gave a wrong result (max error {error:.3g} against float64)"


def _sync(kind: str, device: Any, torch: Any) -> None:
    if kind == "cuda":
        torch.cuda.synchronize(device)


def _device_name(kind: str, index: int, torch: Any) -> str:
    if kind == "cuda":
        try:
            return str(torch.cuda.get_device_name(index))
        except Exception:  # noqa: BLE001
            return "GPU"
    return f"CPU ({torch.get_num_threads()} threads)"


# -- NVML ---------------------------------------------------------------------------------------


def _nvml(torch: Any, gpus: int) -> tuple[dict[int, dict[str, Any]], str]:
    """Each visible GPU's NVML counters, by its CUDA index (matched by PCI bus id, so
    ``CUDA_VISIBLE_DEVICES`` does not mix them up), and how NVML answered."""
    if not gpus:
        return {}, "absent"
    try:
        import pynvml  # nvidia-ml-py: phalanx's `gpu` extra
    except ImportError:
        return {}, "absent (pip install 'phalanx[gpu]' for ECC and throttle counters)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - a broken driver is a finding
        return {}, f"error: {exc}"
    try:
        out = {}
        for index in range(gpus):
            try:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(_bus_id(torch, index))
            except Exception:  # noqa: BLE001 - no PCI info from torch: NVML's own order
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            out[index] = nvml_counters(pynvml, handle)
        return out, "ok"
    except Exception as exc:  # noqa: BLE001
        return {}, f"error: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _bus_id(torch: Any, index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"


def nvml_counters(nvml: Any, handle: Any) -> dict[str, Any]:
    """What NVML says about one GPU's health; a counter the GPU does not support is left out."""
    out: dict[str, Any] = {}

    def read(key: str, call: Any) -> None:
        try:
            out[key] = call()
        except Exception:  # noqa: BLE001 - NotSupported on GPUs without ECC, older drivers
            pass

    read("temperature_c", lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
    read("ecc_uncorrected", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)))
    read("ecc_corrected", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)))

    def remapped() -> None:
        _, _, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
        out["remap_pending"], out["remap_failure"] = bool(pending), bool(failure)

    read("_remapped", remapped)
    out.pop("_remapped", None)
    read("retired_pending", lambda: bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)))
    getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    if getter is not None:
        read("throttle", lambda: [name for bit, name in THROTTLE.items() if int(getter(handle)) & bit])
    return out


if __name__ == "__main__":
    main()

"""Benchmark: streaming ingest of a large Kineto (PyTorch profiler) trace.

    python bench/bench_traces.py [--mb 1024] [--keep DIR] [--runs 1]

Writes a synthetic Chrome trace of about `--mb` MB into a temporary directory, laid out as
Kineto writes it (header members, then `traceEvents` with one pretty-printed event per entry,
then the trailer), with the event mix of a real training profile: CPU ops and Python functions
(most of the file), CUDA runtime calls, record_function ranges, ProfilerStep#N annotations,
compute kernels, NCCL all-reduce kernels, memcpys and memsets. Then it parses the file with the
analyzer's Kineto reader (discover -> parse_input) in a fresh process and prints the ingest speed
(MB/s) and that process's peak resident memory, next to the same process's memory after only the
imports, and the CPU time it used (a better figure than wall time on a shared machine). The
trace is never loaded whole: memory should stay at a few blocks plus the kept
GPU-activity columns, far below the file's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CPU_OPS = ("aten::mm", "aten::add_", "aten::empty", "aten::relu", "aten::copy_", "aten::mul", "aten::sum", "aten::t")
_KERNELS = (
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(T, U, V...)",
)
_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _event(ph: str, cat: str, name: str, pid: int, tid: int, offset: float, dur: float, args: dict) -> tuple[str, float, str]:
    """One event as (text before ts, ts offset within its step, text after ts), Kineto's layout."""
    head = json.dumps({"ph": ph, "cat": cat, "name": name, "pid": pid, "tid": tid})[1:-1]
    arg_text = ",\n      ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in args.items())
    return f'  {{\n    {head},\n    "ts": ', offset, f', "dur": {dur:.3f},\n    "args": {{\n      {arg_text}\n    }}\n  }}'


def _step_template() -> tuple[list[tuple[str, float, str]], float, int]:
    """The events of one training step, with ts offsets; returns them, the step length and the GPU op count."""
    parts = [_event("X", "user_annotation", "data_loader", 1713, 1713, 0.0, 800.0, {"External id": 1})]
    t, corr, gpu = 800.0, 1, 0
    for i in range(400):  # CPU side of one step: ops, their launches, and the kernels they run
        corr += 1
        op = _CPU_OPS[i % len(_CPU_OPS)]
        parts.append(_event("X", "cpu_op", op, 1713, 1713, t, 12.5, {"External id": corr, "Record function id": 0, "Input Dims": [[64, 4096], [4096, 4096]], "Input type": ["float", "float"]}))
        parts.append(_event("X", "python_function", "torch/nn/modules/module.py(1775): _call_impl", 1713, 1713, t, 14.0, {"Python parent id": corr - 1, "Python id": corr, "Python thread": 0}))
        parts.append(_event("X", "cuda_runtime", "cudaLaunchKernel", 1713, 1713, t + 2, 4.0, {"External id": corr, "cbid": 211, "correlation": corr}))
        parts.append(_event("X", "kernel", _KERNELS[i % len(_KERNELS)], 0, 7, t + 10, 25.0, {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": corr, "registers per thread": 168, "shared memory": 0, "blocks per SM": 1.0, "warps per SM": 4.0, "grid": [132, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 6}))
        gpu += 1
        if i % 50 == 49:
            parts.append(_event("X", "kernel", _NCCL, 0, 21, t + 12, 300.0, {"External id": corr, "device": 0, "stream": 21, "correlation": corr}))
            parts.append(_event("X", "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 0, 7, t + 20, 3.0, {"device": 0, "stream": 7, "correlation": corr, "bytes": 4, "memory bandwidth (GB/s)": 1.3}))
            gpu += 2
        t += 30.0
    return parts, t, gpu


def write_trace(path: Path, target_bytes: int, rank: int = 0, world: int = 8) -> dict:
    """Write a synthetic trace of about target_bytes; returns counts of what it holds."""
    counts = {"events": 0, "kernels": 0, "steps": 0}
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": d, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "numSms": 132} for d in range(8)],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "nccl_version": "2.28.9"},
        "record_shapes": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1790857026000000000,
    }
    parts, length, gpu = _step_template()
    t = 5_200_534_000_000.0
    with open(path, "w", encoding="utf-8") as out:
        out.write("{\n" + "".join(f'  "{k}": {json.dumps(v)},\n' for k, v in header.items()) + '  "traceEvents": [\n')
        written = out.tell()
        step = 0
        while written < target_bytes:
            events = [f"{before}{t + offset:.3f}{after}" for before, offset, after in parts]
            events.append(_event("X", "user_annotation", f"ProfilerStep#{step}", 1713, 1713, 0.0, length, {"External id": 1})[0] + f"{t:.3f}" + f', "dur": {length:.3f},\n    "args": {{}}\n  }}')
            text = ("" if step == 0 else ",\n") + ",\n".join(events)
            out.write(text)
            written += len(text)
            counts["events"] += len(events)
            counts["kernels"] += gpu
            counts["steps"] += 1
            step += 1
            t += length + 100.0
        out.write('\n  ],\n  "traceName": "/tmp/synthetic/rank0.json"\n}\n')
    counts["bytes"] = path.stat().st_size
    return counts


_CHILD = """
import json, resource, sys, time
import polars as pl
from analyzer.io import discover
from analyzer.parse import parse_input
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0, c0 = time.perf_counter(), time.process_time()
(item,) = discover(sys.argv[1])
events = parse_input(item)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
summary = events.filter(pl.col("kind") == "trace.rank").get_column("detail").to_list()
print(json.dumps({"elapsed": elapsed, "cpu": cpu, "peak_kb": peak, "base_kb": base, "status": item.status,
                  "reason": item.reason, "events": events.height, "summary": summary}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="size of the synthetic trace in MB (default 1024)")
    parser.add_argument("--runs", type=int, default=1, help="parse runs (fresh process each); the median is reported")
    parser.add_argument("--keep", type=Path, help="write the trace here instead of a temporary directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="postmortem-bench-traces-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / "rank0.json"
        t0 = time.perf_counter()
        counts = write_trace(trace, args.mb << 20)
        print(f"generated {counts['bytes'] / 1e6:,.0f} MB: {counts['events']:,} events, {counts['kernels']:,} GPU ops, "
              f"{counts['steps']:,} steps in {time.perf_counter() - t0:.1f} s")
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        results = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", _CHILD, str(trace)], capture_output=True, text=True, env=env, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        results.sort(key=lambda r: r["elapsed"])
        r = results[len(results) // 2]
        mb = counts["bytes"] / 1e6
        print(f"status: {r['status']} {r['reason']}".rstrip())
        print(f"ingest: {r['elapsed']:.1f} s wall, {mb / r['elapsed']:.1f} MB/s ({counts['events'] / r['elapsed'] / 1e6:.2f} M events/s); "
              f"CPU time {r['cpu']:.1f} s ({mb / r['cpu']:.1f} MB per CPU-second, all threads)")
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall figures assume an idle machine)")
        print(f"peak RSS: {r['peak_kb'] / 1024:,.0f} MB (after imports: {r['base_kb'] / 1024:,.0f} MB; trace: {mb:,.0f} MB)")
        print(f"events emitted: {r['events']}; rank summary: {r['summary'][0] if r['summary'] else '-'}")


if __name__ == "__main__":
    main()

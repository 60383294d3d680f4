"""``make loadtest-ramp``: raise the order rate step by step and report the knee.

    python -m loadtest.ramp [--rates 100,200,400,...] [--step 15] [--slo-ms 1000]
                            [--pollers 1] [--processes 1] [--app-workers 2]
                            [--concurrency 64] [--drain 60] [--out loadtest/out]

The stack of ``make loadtest`` (PostgreSQL, receiver, order app, pollers; see
loadtest/stack.py) under locust's step shape (loadtest/locust_ramp.py): each
step offers one order rate for ``--step`` seconds. After each step the ramp
reads the backlog (orders committed minus webhooks applied at the receiver)
and stops early once it is worth more than the SLO at that rate (deliveries
fell behind commits) or the offered rate was not reached (the generator or the
app is the limit). Then it drains (bounded) and reports, per step: offered,
committed and delivered rates, commit→receipt p50/p95/p99 of the orders
committed in the step (an order still undelivered counts as infinitely late),
and CPU per process from /proc (cores busy, process trees: PostgreSQL is its
postmaster and backends).

**The knee** is the highest committed rate of a step before the first step that
broke the SLO (p99 above ``--slo-ms``, or anything undelivered); the report
names the processes that were saturated (≥ 0.85 core, or the machine ≥ 90 %
busy) in the step that broke. Writes ``ramp.md``, ``ramp.json`` and
``ramp.png`` (rates, latency, CPU over time) in ``--out``. Bounded: at most
len(rates) × step + drain seconds, every process ended by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from loadtest.procs import Proc, clean_env, machine_cpu_seconds, tree_cpu_seconds
from loadtest.stack import servers, stack
from poller.store.db import sync_engine

DEFAULT_RATES = "100,200,400,600,800,1000,1300,1600,2000,2500,3000"
CREATED = "SELECT idempotency_key, extract(epoch FROM created_at) FROM poller_outbox"
SATURATED_CORE = 0.85
SATURATED_MACHINE = 0.9


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default=DEFAULT_RATES, help="orders/s of each step")
    parser.add_argument("--step", type=float, default=15.0, help="seconds per step")
    parser.add_argument("--slo-ms", type=float, default=1000.0, help="commit→receipt p99 SLO")
    parser.add_argument("--pollers", type=int, default=1)
    parser.add_argument("--processes", type=int, default=1, help="`poller run --processes`")
    parser.add_argument("--app-workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--per-user", type=float, default=5.0, help="orders/s per locust user")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--drain", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("loadtest/out"))
    return parser.parse_args()


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def knee(steps: list[dict[str, Any]], slo_ms: float) -> dict[str, Any]:
    """The last step within the SLO before the first that broke it, and what saturated."""
    best: dict[str, Any] | None = None
    broke: dict[str, Any] | None = None
    for step in steps:
        p99 = step["latency_ms"]["p99"]
        if step["undelivered"] or p99 is None or p99 > slo_ms:
            broke = step
            break
        if best is None or step["committed_per_s"] > best["committed_per_s"]:
            best = step
    judged = broke or (steps[-1] if steps else None)
    saturated = []
    if judged is not None:
        saturated = [
            f"{name} ({cores:.2f} core)"
            for name, cores in sorted(judged["cpu_cores"].items(), key=lambda kv: -kv[1])
            if cores >= SATURATED_CORE
        ]
        if judged["machine_busy"] >= SATURATED_MACHINE:
            saturated.append(f"the machine ({judged['machine_busy']:.0%} busy)")
    return {
        "orders_per_s": best["committed_per_s"] if best else None,
        "offered_per_s": best["offered_per_s"] if best else None,
        "broke_at_offered_per_s": broke["offered_per_s"] if broke else None,
        "slo_ms": slo_ms,
        "saturated": saturated,
        "generator_bound": bool(
            judged is not None and judged["committed_per_s"] < 0.9 * judged["offered_per_s"]
        ),
    }


def _step_figures(
    rows: list[tuple[str, float]],
    answers: dict[str, float],
    receipts: dict[str, float],
    start: float,
    end: float,
) -> dict[str, Any]:
    """Figures of the orders whose transaction began in [start, end).

    Latency runs from the app's answer (sent once COMMIT returned; the
    transaction's start when locust never got the answer) to the receiver
    applying the webhook; ``p50_from_tx_start`` adds the app's own time."""
    wall = end - start
    created = [(k, c) for k, c in rows if start <= c < end]
    late = sorted((receipts[k] - answers.get(k, c)) * 1000 for k, c in created if k in receipts)
    from_start = sorted((receipts[k] - c) * 1000 for k, c in created if k in receipts)
    missing = sum(1 for k, _ in created if k not in receipts)
    received = sum(1 for r in receipts.values() if start <= r < end)
    ordered = late + [float("inf")] * missing
    return {
        "committed_per_s": len(created) / wall,
        "delivered_per_s": received / wall,
        "undelivered": missing,
        "latency_ms": {
            "p50": _pct(ordered, 0.5),
            "p95": _pct(ordered, 0.95),
            "p99": _pct(ordered, 0.99),
            "p50_from_tx_start": _pct(from_start, 0.5),
        },
    }


def _answers(path: Path) -> dict[str, float]:
    found: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, at = line.partition(" ")
            with contextlib.suppress(ValueError):
                found[key] = float(at)
    return found


def main() -> None:
    args = _args()
    args.out.mkdir(parents=True, exist_ok=True)
    rates = [float(r) for r in args.rates.split(",")]
    with (
        tempfile.TemporaryDirectory(prefix="poller-ramp-") as tmp_name,
        servers(Path(tmp_name)) as running,
        stack(
            Path(tmp_name),
            running,
            pollers=args.pollers,
            processes=args.processes,
            concurrency=args.concurrency,
            app_workers=args.app_workers,
        ) as procs,
    ):
        engine = sync_engine(running.database_url)
        locust = Proc(
            ["-f", "loadtest/locust_ramp.py", "--headless", "--host", procs.app_url,
             "--csv", str(args.out / "ramp_locust"), "--only-summary"],
            clean_env(
                LOADTEST_RATES=",".join(str(r) for r in rates),
                LOADTEST_STEP_SECONDS=str(args.step),
                LOADTEST_PER_USER=str(args.per_user),
                LOADTEST_T0_FILE=str(Path(tmp_name) / "t0"),
                LOADTEST_ANSWERS_FILE=str(Path(tmp_name) / "answers"),
            ),
            args.out / "ramp_locust.log",
            module="locust",
        )  # fmt: skip
        try:
            watched = {
                "postgres": running.postgres_pid,
                "app": procs.app.popen.pid,
                "receiver": procs.receiver.popen.pid,
                "locust": locust.popen.pid,
                **{f"poller-{i}": p.popen.pid for i, p in enumerate(procs.pollers)},
            }
            steps = _run_steps(
                args, rates, engine, procs.receiver_url, locust, watched, Path(tmp_name) / "t0"
            )
            locust.stop()
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline and _count(
                engine, "SELECT count(*) FROM poller_outbox WHERE status IN ('pending','in_flight')"
            ):
                time.sleep(0.5)
            receipts = httpx.get(f"{procs.receiver_url}/receipts", timeout=60).json()
            with engine.connect() as conn:
                rows = [(k, float(c)) for k, c in conn.execute(text(CREATED))]
            answers = _answers(Path(tmp_name) / "answers")
        finally:
            locust.stop()
            engine.dispose()
    for step in steps:
        step.update(_step_figures(rows, answers, receipts, step["start"], step["end"]))
    report = {"settings": {k: str(v) for k, v in vars(args).items()}, "steps": steps}
    report["knee"] = knee(steps, args.slo_ms)
    _write(report, rows, answers, receipts, args.out)


def _run_steps(
    args: argparse.Namespace,
    rates: list[float],
    engine: Engine,
    receiver_url: str,
    locust: Proc,
    watched: dict[str, int | None],
    t0_file: Path,
) -> list[dict[str, Any]]:
    """Wait out each step, sampling CPU and the backlog; stop after the first breach."""
    began = time.monotonic() + 60
    while not t0_file.exists() or _count(engine, "SELECT count(*) FROM loadtest_orders") == 0:
        if time.monotonic() > began or locust.popen.poll() is not None:
            raise SystemExit(f"locust placed no order:\n{locust.output()[-2000:]}")
        time.sleep(0.05)
    t0 = float(t0_file.read_text())
    steps: list[dict[str, Any]] = []
    cpu = {n: tree_cpu_seconds(p) for n, p in watched.items() if p}
    machine = machine_cpu_seconds()
    committed_before = 0
    for i, rate in enumerate(rates):
        end = t0 + (i + 1) * args.step
        while time.time() < end and locust.popen.poll() is None:
            time.sleep(0.1)
        now_cpu = {n: tree_cpu_seconds(p) for n, p in watched.items() if p}
        now_machine = machine_cpu_seconds()
        wall = args.step
        applied = int(httpx.get(f"{receiver_url}/stats", timeout=10).json()["unique"])
        committed = _count(engine, "SELECT count(*) FROM loadtest_orders")
        backlog = committed - applied
        busy = (now_machine[0] - machine[0]) / max(1e-9, now_machine[1] - machine[1])
        steps.append(
            {
                "offered_per_s": rate,
                "start": t0 + i * args.step,
                "end": end,
                "backlog_at_end": backlog,
                "cpu_cores": {n: round((now_cpu[n] - cpu[n]) / wall, 3) for n in now_cpu},
                "machine_busy": round(busy, 3),
            }
        )
        cpu, machine = now_cpu, now_machine
        placed = (committed - committed_before) / wall
        print(
            f"step {i + 1}: offered {rate:.0f}/s, committed {placed:.0f}/s, "
            f"backlog {backlog}, machine {busy:.0%} busy",
            flush=True,
        )
        behind = backlog > rate * args.slo_ms / 1000
        short = committed - committed_before < 0.8 * rate * wall
        committed_before = committed
        if behind or short or locust.popen.poll() is not None:
            break
    return steps


def _write(
    report: dict[str, Any],
    rows: list[tuple[str, float]],
    answers: dict[str, float],
    receipts: dict[str, float],
    out: Path,
) -> None:
    (out / "ramp.json").write_text(json.dumps(report, indent=2, default=str))
    k = report["knee"]

    def ms(value: float | None) -> str:
        if value is None:
            return "—"
        return "∞" if value == float("inf") else f"{value:.1f}" if value < 10 else f"{value:.0f}"

    lines = [
        "# Load ramp: where commit→receipt leaves the SLO",
        "",
        f"**Knee: {ms(k['orders_per_s'])} orders/s** committed and delivered within a p99 of "
        f"{k['slo_ms']:.0f} ms (offered {ms(k['offered_per_s'])}/s); broke at "
        f"{ms(k['broke_at_offered_per_s'])}/s offered. Saturated: "
        f"{', '.join(k['saturated']) or 'nothing ≥ 0.85 core'}"
        + (" — the generator/app did not place the offered rate." if k["generator_bound"] else "."),
        "",
        "| offered/s | committed/s | delivered/s | p50 ms | p95 ms | p99 ms "
        "| p50 from tx start | undelivered | backlog | machine busy | CPU cores per process |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["steps"]:
        cores = ", ".join(f"{n} {c:.2f}" for n, c in sorted(s["cpu_cores"].items()))
        lat = s["latency_ms"]
        lines.append(
            f"| {s['offered_per_s']:.0f} | {s['committed_per_s']:.0f} | {s['delivered_per_s']:.0f} "
            f"| {ms(lat['p50'])} | {ms(lat['p95'])} | {ms(lat['p99'])} "
            f"| {ms(lat['p50_from_tx_start'])} | {s['undelivered']} "
            f"| {s['backlog_at_end']} | {s['machine_busy']:.0%} | {cores} |"
        )
    (out / "ramp.md").write_text("\n".join(lines) + "\n")
    _plot(report, rows, {**dict(rows), **answers}, receipts, out / "ramp.png")
    print("\n".join(lines))


def _plot(
    report: dict[str, Any],
    rows: list[tuple[str, float]],
    committed: dict[str, float],
    receipts: dict[str, float],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report["steps"]
    if not steps:
        return
    t0 = steps[0]["start"]
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    commits: dict[int, int] = {}
    arrivals: dict[int, int] = {}
    late: dict[int, list[float]] = {}
    for _, c in rows:
        commits[int(c - t0)] = commits.get(int(c - t0), 0) + 1
    for key, r in receipts.items():
        arrivals[int(r - t0)] = arrivals.get(int(r - t0), 0) + 1
        if key in committed:
            late.setdefault(int(r - t0), []).append((r - committed[key]) * 1000)
    edges = [s["start"] - t0 for s in steps] + [steps[-1]["end"] - t0]
    offered = [s["offered_per_s"] for s in steps]
    top.step(edges, [*offered, offered[-1]], where="post", label="offered orders/s")
    for name, series in (("committed/s", commits), ("received/s", arrivals)):
        xs = sorted(series)
        top.plot(xs, [series[x] for x in xs], label=name)
    top.set_ylabel("per second")
    top.legend()
    xs = sorted(late)
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        mid.plot(xs, [sorted(late[x])[int(q * (len(late[x]) - 1))] for x in xs], label=label)
    mid.axhline(report["knee"]["slo_ms"], color="red", linestyle="--", label="SLO")
    mid.set_yscale("log")
    mid.set_ylabel("commit→receipt ms")
    mid.legend()
    for name in steps[0]["cpu_cores"]:
        values = [s["cpu_cores"].get(name, 0.0) for s in steps]
        bottom.step(edges, [*values, values[-1]], where="post", label=name)
    bottom.set_ylabel("CPU cores")
    bottom.set_xlabel("seconds since the first order")
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()

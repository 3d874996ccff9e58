"""``picker bench lab-eval``: picker's default against the baselines over the standard workloads and the messy
pools of production (the lab report).

    picker bench lab-eval --json lab-eval.json --png docs/img/lab-eval.png --markdown lab-eval.md
    picker bench lab-eval --quick                                                # a small version (tests)
    picker bench lab-eval --jobs 2 --cache runs --seeds 0,1,2                    # the count on the mean of 3 seeds
    picker bench lab-eval --jobs 2 --seeds 0-9 --settle-seeds 30                 # undecided points at 30 seeds
    picker bench lab-eval --workloads shared-prefix --scenarios plain --config candidate.yaml   # a candidate
    picker bench lab-eval --workloads seed-mix --jobs 2          # servers that run out of slots (docs/lab.md)

Workload groups (docs/lab.md): ``standard``, four workloads (``EVAL_WORKLOADS``) on 8 simulated ``h100-8b``
engines under the ``SCENARIOS``: ``plain`` (one picker sees every request) at a ladder of rates around round
robin's knee and past it, and at one rate below the knee and one past it the pools picker really runs in (traffic
bypassing the routers, spread or onto one server; routers restarting with full queues; one slow server; 2 or 4
independent router replicas). ``seed-mix`` runs the seed's mix on 4 servers of 16 sequences (``cpu``,
``gpu-bounded``, a mixed pool), open loop across the knee and closed loop, and reports its short-request TTFT,
long-answer TPOT and e2e besides. Every policy sees the same requests at the same times.

For each point it prints the lab's table and the ratios of picker's p90 TTFT to the best other policy's and to
round robin's; a point is met within 2 % of the best (``WITHIN``). ``--json`` writes every run's summary and the
ratios, ``--png`` p90 TTFT against the rate, ``--markdown`` the tables. ``--jobs`` runs points in parallel
processes (each run is deterministic). ``--cache DIR`` reuses a run while nothing it depends on changed (picker's
source, the config file, the point). ``--seeds`` runs every point at each seed and takes the ratios of the p90s
averaged over them, since a single seed's p90 past the knee varies; the tables are the first seed's runs. With
several seeds each point also says at how many seeds picker was outside 2 %, and from ``MIN_SEEDS_FOR_INTERVAL``
seeds the 95 % bootstrap interval of the ratio (seeds resampled ``_RESAMPLES`` times): a point outside 2 % whose
interval reaches the line is ``undecided``. ``--settle-seeds N`` runs every policy again, at further seeds until
each has ``N``, wherever the interval reaches across the line (either side). The numbers: docs/performance.md
("Scheduling: policy lab").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import pickle
import random
import stat
import statistics
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from picker import errors
from picker.bench import flags, lab_report
from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, Scenario, poisson_schedule, run_lab
from picker.bench.workloads import WorkItem
from picker.sim.config import EngineConfig, preset

__all__ = [
    "BASELINE_POLICIES",
    "EVAL_WORKLOADS",
    "PICKER",
    "PLAIN",
    "PREVIOUS",
    "SCENARIOS",
    "WITHIN",
    "EvalScenario",
    "EvalWorkload",
    "Ratio",
    "RunCache",
    "configure",
    "evaluate",
    "further_seeds",
    "mean_ratios",
    "plot",
    "ratios",
    "run",
    "run_points",
    "seed_text",
    "settle",
    "straddling",
    "verdict",
    "within",
]

PICKER = "picker"
PREVIOUS = "picker-v1"  # the default before it followed what the servers report (policies.PREVIOUS_CONFIG_TEXT)
BASELINE_POLICIES = (
    "rr",
    "lc",
    "p2c",
    "envoy-least-request",
    "reference",
    "cache-aware",
    "lmetric",
    PREVIOUS,
)
ENGINES = 8
PLAIN = "plain"
WITHIN = 1.02  # a point is met when picker's p90 is at most 2 % above the best other policy's
MIN_SEEDS_FOR_INTERVAL = 5  # fewer seeds give a bootstrap interval too coarse to tell anything by
_RESAMPLES = 2000
LORA_ADAPTERS = ("lora-a", "lora-b", "lora-c")
LORA_WEIGHTS = (60.0, 30.0, 10.0)  # GIE's regression mix


@dataclass(frozen=True, slots=True)
class EvalWorkload:
    """A standard workload with the engines it runs on and its rate ladder (req/s)."""

    name: str
    make: Callable[[int], wl.Workload]  # seed -> workload
    engine: EngineConfig
    rates: tuple[float, ...]
    quick_rates: tuple[float, ...]
    what: str
    scenario_rates: tuple[float, ...] = ()  # the rates of the other scenarios: below the knee, and past it
    engines: int = ENGINES
    preset: str = "h100-8b"  # what ``engine`` was made from (the JSON's record)
    pool: tuple[EngineConfig, ...] = ()  # engine i's own configuration (a mixed pool); empty: ``engine`` for all
    closed: bool = False  # closed loop: the ladder counts concurrent streams, not req/s
    scenarios: tuple[str, ...] | None = None  # the scenarios it runs under (None: all)
    max_requests: int | None = None  # caps --requests (a closed loop's one stream would run for hours otherwise)

    @property
    def unit(self) -> str:
        return "streams" if self.closed else "req/s"


def _engine(**changes: Any) -> EngineConfig:
    # A KV pool (2048 blocks = 32k tokens) that holds a few long prefixes but not all (docs/lab.md).
    return preset("h100-8b", num_gpu_blocks=2048, **changes)


SEED_MIX_ENGINES = 4
SEED_MIX_SCENARIOS = (PLAIN, "slow-server")
CLOSED_REQUESTS = 300
# Two gpu-bounded servers and two larger GPUs of the same speed (64 sequences, 32k tokens of KV): the same
# request count weighs differently on each.
MIXED_POOL = (
    preset("gpu-bounded"),
    preset("gpu-bounded"),
    preset("h100-8b", max_num_seqs=64, num_gpu_blocks=2048, max_model_len=4096),
    preset("h100-8b", max_num_seqs=64, num_gpu_blocks=2048, max_model_len=4096),
)
_SEED_MIX = "the seed's mix: 70 % 13-token prompts answered with 4 tokens, 30 % 116-token prompts with 512"


def _seed_mix_points() -> tuple[EvalWorkload, ...]:
    """The seed's mix where the servers run out of slots: open loop across the knee, closed loop at 1, 4 and 8
    streams, on ``cpu`` and ``gpu-bounded`` servers, and a pool of mixed sizes (docs/lab.md)."""
    common: dict[str, Any] = {"engines": SEED_MIX_ENGINES, "make": lambda seed: wl.seed_mix(seed=seed)}
    closed: dict[str, Any] = {
        **common, "closed": True, "rates": (1.0, 4.0, 8.0), "quick_rates": (4.0,), "scenarios": (PLAIN,),
        "max_requests": CLOSED_REQUESTS,
    }  # fmt: skip
    cpu, gpu = preset("cpu"), preset("gpu-bounded")
    return (
        EvalWorkload(
            "seed-mix-cpu", engine=cpu, preset="cpu", rates=(2.0, 3.0, 4.0, 5.0), quick_rates=(4.0,),
            scenario_rates=(3.0, 4.0), scenarios=SEED_MIX_SCENARIOS, what=f"{_SEED_MIX}; 4 cpu servers (16 seqs)",
            **common,
        ),
        EvalWorkload(
            "seed-mix-cpu-closed", engine=cpu, preset="cpu", what=f"{_SEED_MIX}; 4 cpu servers, closed loop",
            **closed,
        ),
        EvalWorkload(
            "seed-mix-gpu", engine=gpu, preset="gpu-bounded", rates=(8.0, 12.0, 16.0, 20.0), quick_rates=(16.0,),
            scenario_rates=(12.0, 16.0), scenarios=SEED_MIX_SCENARIOS,
            what=f"{_SEED_MIX}; 4 gpu-bounded servers (16 seqs, 256 KV blocks)", **common,
        ),
        EvalWorkload(
            "seed-mix-gpu-closed", engine=gpu, preset="gpu-bounded",
            what=f"{_SEED_MIX}; 4 gpu-bounded servers, closed loop", **closed,
        ),
        EvalWorkload(
            "seed-mix-mixed", engine=gpu, preset="gpu-bounded x2 + h100-8b x2", pool=MIXED_POOL,
            rates=(16.0, 24.0, 32.0), quick_rates=(24.0,), scenarios=(PLAIN,),
            what=f"{_SEED_MIX}; 2 gpu-bounded servers and 2 h100-8b (64 seqs, 2048 blocks)", **common,
        ),
    )  # fmt: skip


EVAL_WORKLOADS: dict[str, EvalWorkload] = {
    w.name: w
    for w in (
        EvalWorkload(
            "shared-prefix",
            lambda seed: wl.shared_prefix(
                num_groups=32, prompts_per_group=16, system_prompt_len=2048, question_len=64, output_len=64, seed=seed
            ),
            _engine(),
            rates=(20.0, 40.0, 80.0, 160.0, 320.0),
            quick_rates=(40.0,),
            scenario_rates=(40.0, 160.0),
            what="32 system prompts of 2048 tokens x 16 questions of 64, answers of ~64 tokens",
        ),
        EvalWorkload(
            # 30 sessions, not a multiple of the 8 engines: with 32, round robin would send every turn of a
            # session to the same engine by accident (turns interleave session by session).
            "multi-turn",
            lambda seed: wl.multi_turn_chat(
                sessions=30, turns=4, system_prompt_len=2048, question_len=64, answer_len=64, output_len=64, seed=seed
            ),
            _engine(),
            rates=(10.0, 20.0, 40.0, 80.0),
            quick_rates=(20.0,),
            scenario_rates=(20.0, 40.0),
            what="30 concurrent sessions of 4 turns, each turn resending the 2048-token system prompt and history",
        ),
        EvalWorkload(
            "short-long",
            lambda seed: wl.short_long(seed=seed),
            _engine(),
            rates=(100.0, 200.0, 400.0, 800.0),
            quick_rates=(200.0,),
            scenario_rates=(100.0, 400.0),
            what="the seed's mix: 13-token prompts, 80 % answered with 4 tokens, 20 % with 512",
        ),
        EvalWorkload(
            "multi-lora",
            lambda seed: wl.multi_lora(wl.sharegpt_like(seed=seed), LORA_ADAPTERS, LORA_WEIGHTS, seed=seed),
            _engine(lora_adapters=LORA_ADAPTERS, max_loras=1),
            rates=(5.0, 10.0, 20.0, 40.0),
            quick_rates=(10.0,),
            scenario_rates=(10.0, 20.0),
            what="ShareGPT-shaped lengths over 3 adapters (60/30/10), engines with max_loras 1",
        ),
        *_seed_mix_points(),
    )
}
# --workloads accepts these names for several workloads at once.
WORKLOAD_GROUPS: dict[str, tuple[str, ...]] = {
    "standard": ("shared-prefix", "multi-turn", "short-long", "multi-lora"),
    "seed-mix": tuple(n for n in EVAL_WORKLOADS if n.startswith("seed-mix-")),
}


Arrivals = Sequence[tuple[float, WorkItem]]


@dataclass(frozen=True, slots=True)
class EvalScenario:
    """A pool around the routers (``lab.Scenario``), made for a run's arrival schedule."""

    name: str
    make: Callable[[Arrivals], Scenario]
    what: str


EXTERNAL_SHARE = 0.3
SLOWDOWN = 2.5


def _restart_midway(arrivals: Arrivals) -> Scenario:
    return Scenario(restart_at_s=arrivals[len(arrivals) // 2][0] if arrivals else 0.0)


SCENARIOS: dict[str, EvalScenario] = {
    s.name: s
    for s in (
        EvalScenario(PLAIN, lambda _: Scenario(), "one router sees every request"),
        EvalScenario(
            "external",
            lambda _: Scenario(external_share=EXTERNAL_SHARE),
            f"{EXTERNAL_SHARE:.0%} of the requests bypass the routers, spread uniformly over the servers",
        ),
        EvalScenario(
            "external-skewed",
            lambda _: Scenario(external_share=EXTERNAL_SHARE, external_target=0),
            f"{EXTERNAL_SHARE:.0%} of the requests bypass the routers, all onto sim-0",
        ),
        EvalScenario(
            "restart",
            _restart_midway,
            "every router restarts (empty ledger and prefix state) halfway through the arrivals",
        ),
        EvalScenario(
            "slow-server",
            lambda _: Scenario(slowdowns=(SLOWDOWN,)),
            f"sim-0 runs {SLOWDOWN:g}x slower than the rest",
        ),
        EvalScenario("replicas-2", lambda _: Scenario(replicas=2), "2 independent routers, round robin between them"),
        EvalScenario("replicas-4", lambda _: Scenario(replicas=4), "4 independent routers, round robin between them"),
    )
}


@dataclass(frozen=True, slots=True)
class Ratio:
    """picker's default against the others at one workload, scenario and rate (p90 TTFT)."""

    workload: str
    rate: float
    picker_p90_s: float
    best_baseline: str
    best_baseline_p90_s: float
    rr_p90_s: float
    vs_best: float  # best baseline p90 / picker p90 (> 1: picker lower; 1.25 = picker 20 % below)
    vs_rr: float  # round robin p90 / picker p90
    lowest: bool  # picker's p90 is the lowest of all
    scenario: str = PLAIN
    # Over several seeds (``mean_ratios``): the seeds where picker's p90 was more than 2 % above the best other
    # policy's (the best on the mean), of how many; and, from ``MIN_SEEDS_FOR_INTERVAL`` seeds, the 95 %
    # bootstrap interval of ``vs_best`` (seeds resampled, each keeping both policies' runs).
    seeds_behind: int | None = None
    seeds: int | None = None
    interval: tuple[float, float] | None = None


def rates_for(
    w: EvalWorkload, scenario: str, *, quick: bool, only: Collection[float] | None = None
) -> tuple[float, ...]:
    """The rates ``w`` runs at under ``scenario``; with ``only``, those of them in it (``--rates``)."""
    if w.scenarios is not None and scenario not in w.scenarios:
        return ()
    ladder = w.quick_rates if quick else (w.rates if scenario == PLAIN else (w.scenario_rates or w.quick_rates))
    return ladder if only is None else tuple(r for r in ladder if r in only)


def _run_point(
    workload: str, scenario: str, rate: float, policy: str, requests: int, seed: int
) -> tuple[lab_report.Row, float]:
    w = EVAL_WORKLOADS[workload]
    n = min(requests, w.max_requests or requests)
    arrivals = (
        [(0.0, item) for item in w.make(seed).take(n)] if w.closed else poisson_schedule(w.make(seed), rate, n, seed)
    )
    config = LabConfig(
        w.engine, engines=w.engines, seed=seed, scenario=SCENARIOS[scenario].make(arrivals), pool=w.pool,
        streams=int(rate) if w.closed else 0,
    )  # fmt: skip
    run_ = run_lab(config, policy, arrivals, workload=workload, rate=rate)
    return lab_report.make_row(policy, run_.result, [f"sim-{i}" for i in range(w.engines)], rate), run_.wall_s


class RunCache:
    """Lab runs kept on disk, each under a key of everything that decides it: picker's source (every ``.py`` and
    ``.c`` file of the package: the simulator, the lab, the policies and the scheduler), the policy (a config
    policy by its file's content), the workload, scenario, rate, request count and seed. A change to any of them
    is a new key, so a kept run is never stale; an old one is simply not read again.

    Runs are pickled, so the directory must be the user's own: it is made private (0700) and refused when it is
    another user's or others can write to it.
    """

    def __init__(self, directory: Path, *, source: Path | None = None) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(f"--cache {directory}: must be a directory of this user that others cannot write to")
        self.directory = directory
        self._source = _source_digest(source or Path(__file__).resolve().parents[1])

    def get(self, point: tuple[str, str, float, str], requests: int, seed: int) -> lab_report.Row | None:
        path = self._path(point, requests, seed)
        try:
            row = pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):  # absent, or torn: run it
            return None
        return row if isinstance(row, lab_report.Row) else None

    def put(self, point: tuple[str, str, float, str], requests: int, seed: int, row: lab_report.Row) -> None:
        path = self._path(point, requests, seed)
        partial = path.with_suffix(".tmp")
        partial.write_bytes(pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL))
        partial.replace(path)  # whole or absent: a run killed mid-write leaves no torn entry

    def _path(self, point: tuple[str, str, float, str], requests: int, seed: int) -> Path:
        workload, scenario, rate, policy = point
        if policy.startswith("config:"):  # the file's content decides the run, not its name
            policy = "config@" + hashlib.sha256(Path(policy.removeprefix("config:")).read_bytes()).hexdigest()
        text = "\n".join((self._source, policy, workload, scenario, repr(float(rate)), str(requests), str(seed)))
        return self.directory / f"{hashlib.sha256(text.encode()).hexdigest()}.pickle"


def _source_digest(package: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".c") and p.is_file()):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


Point = tuple[str, str, float, str]  # workload, scenario, rate, policy


def run_points(
    tasks: Sequence[tuple[Point, int]],
    *,
    requests: int,
    jobs: int = 1,
    log: Callable[[str], None] = print,
    cache: RunCache | None = None,
) -> dict[tuple[Point, int], lab_report.Row]:
    """Each (point, seed) of ``tasks`` run once: from ``cache`` where it holds the run, else in ``jobs``
    processes (one pool for all of them, so no seed waits for another's slowest run)."""
    found: dict[tuple[Point, int], lab_report.Row] = {}

    def done(task: tuple[Point, int], row: lab_report.Row, wall_s: float) -> None:
        found[task] = row
        point, seed = task
        if cache is not None:
            cache.put(point, requests, seed, row)
        log(f"  {point[1]} {point[0]} {point[2]:g} req/s {point[3]} seed {seed}: wall {wall_s:.1f} s")

    todo = []
    for task in dict.fromkeys(tasks):
        kept = cache.get(task[0], requests, task[1]) if cache is not None else None
        if kept is None:
            todo.append(task)
        else:
            found[task] = kept
    if cache is not None:
        log(f"  {len(found)} of {len(found) + len(todo)} runs from the cache {cache.directory}")
    if jobs <= 1:
        for task in todo:
            done(task, *_run_point(*task[0], requests, task[1]))
    else:
        with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
            futures = {pool.submit(_run_point, *task[0], requests, task[1]): task for task in todo}
            for future in concurrent.futures.as_completed(futures):
                done(futures[future], *future.result())
    return found


def evaluate(
    workloads: Sequence[EvalWorkload],
    policies: Sequence[str],
    *,
    requests: int,
    seeds: Sequence[int] = (0,),
    quick: bool = False,
    scenarios: Sequence[str] = (PLAIN,),
    jobs: int = 1,
    log: Callable[[str], None] = print,
    cache: RunCache | None = None,
    rates: Collection[float] | None = None,
) -> dict[int, dict[tuple[str, str], list[lab_report.Row]]]:
    """Every policy on every workload, under every scenario, at each rate of its ladder (those in ``rates``
    when given), at each of ``seeds``: per seed, rows per (scenario, workload) that has a rate, in rate then
    policy order. ``jobs`` > 1 runs them in that many processes (one pool for every seed); ``cache`` supplies
    the runs it holds and keeps the new ones."""
    points = [
        (w.name, sc, rate, policy)
        for sc in scenarios
        for w in workloads
        for rate in rates_for(w, sc, quick=quick, only=rates)
        for policy in policies
    ]
    found = run_points([(p, s) for s in seeds for p in points], requests=requests, jobs=jobs, log=log, cache=cache)
    out: dict[int, dict[tuple[str, str], list[lab_report.Row]]] = {}
    for seed in seeds:
        at = out[seed] = {}
        for point in points:
            at.setdefault((point[1], point[0]), []).append(found[(point, seed)])
    return out


def straddling(ratio: Ratio) -> bool:
    """Whether the seeds' 95 % interval of ``ratio`` reaches across the 2 % line: more seeds could move the
    point to either side of it, whichever side its mean is on now."""
    return ratio.interval is not None and ratio.interval[0] < 1 / WITHIN <= ratio.interval[1]


def further_seeds(seeds: Collection[int], total: int) -> list[int]:
    """The lowest seeds not in ``seeds`` that bring them to ``total``."""
    out: list[int] = []
    candidate = 0
    while len(seeds) + len(out) < total:
        if candidate not in seeds:
            out.append(candidate)
        candidate += 1
    return out


def settle(
    unsettled: Sequence[Ratio],
    by_seed: Mapping[int, Results],
    policies: Sequence[str],
    *,
    total: int,
    requests: int,
    focus: str = PICKER,
    jobs: int = 1,
    log: Callable[[str], None] = print,
    cache: RunCache | None = None,
) -> tuple[list[Ratio], dict[int, Results]]:
    """``unsettled`` (ratios over the seeds of ``by_seed``) again over ``total`` seeds: every policy run at each
    of their points at the seeds ``further_seeds`` adds. Returns the new ratios, in the same order, and the
    added seeds' rows (only these points')."""
    extra = further_seeds(list(by_seed), total)
    points = [(r.workload, r.scenario, r.rate, p) for r in unsettled for p in policies]
    found = run_points([(p, s) for s in extra for p in points], requests=requests, jobs=jobs, log=log, cache=cache)
    added: dict[int, Results] = {s: {} for s in extra}
    for seed in extra:
        for point in points:
            added[seed].setdefault((point[1], point[0]), []).append(found[(point, seed)])
    out = []
    for r in unsettled:
        at_rate = [
            [row for row in results[(r.scenario, r.workload)] if row.rate == r.rate]
            for results in (*by_seed.values(), *added.values())
        ]
        [again] = mean_ratios(r.workload, at_rate, picker=focus, scenario=r.scenario)
        out.append(again)
    return out, added


def ratios(name: str, rows: Sequence[lab_report.Row], picker: str = PICKER, scenario: str = PLAIN) -> list[Ratio]:
    """The ratios at each rate where picker and at least one other policy ran."""
    return _ratios(name, _p90s(rows), picker, scenario)


def mean_ratios(
    name: str, runs: Sequence[Sequence[lab_report.Row]], picker: str = PICKER, scenario: str = PLAIN
) -> list[Ratio]:
    """The ratios of the p90s averaged over several seeds' rows of the same points (``runs``: one list per seed);
    a policy and rate count where every seed ran them."""
    per_seed = [_p90s(rows) for rows in runs]
    mean: dict[float, dict[str, float]] = {}
    for rate, first in (per_seed[0] if per_seed else {}).items():
        labels = [k for k in first if all(k in seed.get(rate, {}) for seed in per_seed)]
        mean[rate] = {k: statistics.fmean(seed[rate][k] for seed in per_seed) for k in labels}
    out = _ratios(name, mean, picker, scenario)
    if len(per_seed) < 2:
        return out
    return [_over_seeds(r, [(seed[r.rate][picker], seed[r.rate][r.best_baseline]) for seed in per_seed]) for r in out]


def _over_seeds(ratio: Ratio, pairs: Sequence[tuple[float, float]]) -> Ratio:
    """``ratio`` with how it held seed by seed: ``pairs`` are (picker's p90, the best other policy's) per seed."""
    behind = sum(mine > WITHIN * best for mine, best in pairs)
    interval = None
    if len(pairs) >= MIN_SEEDS_FOR_INTERVAL:
        # A fixed stream: the same runs always print the same interval.
        rng = random.Random(0)
        n = len(pairs)
        samples = []
        for _ in range(_RESAMPLES):
            drawn = [pairs[rng.randrange(n)] for _ in range(n)]
            samples.append(_div(sum(b for _, b in drawn), sum(m for m, _ in drawn)))
        samples.sort()
        interval = (samples[int(0.025 * _RESAMPLES)], samples[int(0.975 * _RESAMPLES) - 1])
    return replace(ratio, seeds_behind=behind, seeds=len(pairs), interval=interval)


def within(ratio: Ratio) -> bool:
    """Whether picker's p90 is at most 2 % above the best other policy's there (``WITHIN``)."""
    return ratio.vs_best >= 1 / WITHIN


def verdict(ratio: Ratio) -> str:
    """``yes`` (the lowest), ``within 2 %``, or, outside: ``no``, or ``undecided`` where the bootstrap interval
    over the seeds still reaches the 2 % line (another draw of seeds could put the point within)."""
    if ratio.lowest:
        return "yes"
    if within(ratio):
        return "within 2 %"
    if ratio.interval is not None and ratio.interval[1] >= 1 / WITHIN:
        return "undecided"
    return "no"


def _p90s(rows: Sequence[lab_report.Row]) -> dict[float, dict[str, float]]:
    return {
        rate: {r.label: r.summary.ttft_s.p90 for r in at}
        for rate, at in lab_report.by_rate(rows).items()
        if rate is not None
    }


def _ratios(name: str, by_rate: Mapping[float, Mapping[str, float]], picker: str, scenario: str) -> list[Ratio]:
    out = []
    for rate, p90 in by_rate.items():
        if picker not in p90 or len(p90) < 2:
            continue
        others = {k: v for k, v in p90.items() if k != picker}
        best = min(others, key=others.__getitem__)
        mine = p90[picker]
        rr = p90.get("rr", float("nan"))
        out.append(
            Ratio(
                name, rate, mine, best, others[best], rr, _div(others[best], mine), _div(rr, mine),
                lowest=mine <= others[best], scenario=scenario,
            )
        )  # fmt: skip
    return out


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def _run_json(row: lab_report.Row) -> dict[str, Any]:
    s = row.summary
    return {
        "policy": row.label,
        "rate": row.rate,
        "ttft_s": {"p50": s.ttft_s.p50, "p90": s.ttft_s.p90, "p99": s.ttft_s.p99, "mean": s.ttft_s.mean},
        "tpot_p50_s": s.tpot_s.p50,
        "e2e_p50_s": s.e2e_s.p50,
        "throughput_rps": s.throughput_rps,
        "output_tok_s": s.output_tok_s,
        "cached_share": s.cached_share,
        "imbalance": row.imbalance,
        "ok": s.ok,
        "failed": s.failed,
        **({"mix": row.mix.to_json()} if row.mix is not None else {}),
    }


Results = dict[tuple[str, str], list[lab_report.Row]]  # (scenario, workload) -> rows


def plot(results: Results, path: str | Path, picker: str = PICKER) -> None:
    """p90 TTFT against the rate, log-log: one panel per workload for the plain scenario, one per workload for
    the other scenarios (a line per scenario and policy would not read: there, the policies side by side, per
    scenario, at the higher of the two rates). picker's default drawn thick."""
    from matplotlib.figure import Figure  # no pyplot: no global state

    plain = [(w, rows) for (sc, w), rows in results.items() if sc == PLAIN]
    others = [(sc, w, rows) for (sc, w), rows in results.items() if sc != PLAIN]
    workloads_other = list(dict.fromkeys(w for _, w, _ in others))
    panels = len(plain) + len(workloads_other)
    cols = 2 if panels > 1 else 1
    nrows = max(1, (panels + cols - 1) // cols)
    fig = Figure(figsize=(6.5 * cols, 4.2 * nrows), layout="constrained")
    fig.suptitle("policy lab: p90 TTFT (simulated engines; docs/lab.md)")
    axes = list(fig.subplots(nrows, cols, squeeze=False).flat)
    labels = list(dict.fromkeys(r.label for rows in results.values() for r in rows))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for ax, (name, rows) in zip(axes, plain, strict=False):
        for label in labels:
            pts = sorted((r.rate, r.summary.ttft_s.p90 * 1e3) for r in rows if r.label == label and r.rate)
            if pts:
                thick = label == picker
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[label], label=label,
                    linewidth=3 if thick else 1.2, zorder=3 if thick else 2,
                )  # fmt: skip
        unit = EVAL_WORKLOADS[name].unit if name in EVAL_WORKLOADS else "req/s"
        ax.set(title=name, xlabel=unit, ylabel="p90 TTFT (ms)", yscale="log", xscale="log")
        ax.legend(fontsize="small")
    for ax, name in zip(axes[len(plain) :], workloads_other, strict=False):
        scs = [(sc, rows) for sc, w, rows in others if w == name]
        width = 0.8 / max(1, len(labels))
        top_rate = 0.0
        for j, label in enumerate(labels):
            ys = []
            for _, rows in scs:
                top_rate = max((r.rate or 0.0 for r in rows), default=0.0)
                at = [r for r in rows if r.label == label and r.rate == top_rate]
                ys.append(at[0].summary.ttft_s.p90 * 1e3 if at else float("nan"))
            xs = [i + j * width for i in range(len(scs))]
            ax.bar(xs, ys, width, color=colors[label], label=label, edgecolor="black" if label == picker else None)
        ticks = [i + width * (len(labels) - 1) / 2 for i in range(len(scs))]
        ax.set_xticks(ticks, [sc for sc, _ in scs], rotation=30)
        ax.set(title=f"{name} at {top_rate:g} req/s, by scenario", ylabel="p90 TTFT (ms)", yscale="log")
        ax.legend(fontsize="x-small", ncols=2)
    for ax in axes[panels:]:
        ax.set_visible(False)
    fig.savefig(str(path), dpi=100)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads",
        default=",".join(EVAL_WORKLOADS),
        help=f"comma list of {', '.join(EVAL_WORKLOADS)}, or of the groups {', '.join(WORKLOAD_GROUPS)}",
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument(
        "--policies",
        default=",".join((*BASELINE_POLICIES, PICKER)),
        help="comma list of lab policies (picker bench lab --help); 'picker' is the one the ratios are about",
    )
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="also run config:FILE")
    parser.add_argument(
        "--focus", default=PICKER, metavar="POLICY", help="the policy the ratios are about (default: picker)"
    )
    parser.add_argument("--requests", type=int, help="requests per run (default 1500; 400 with --quick)")
    parser.add_argument("--quick", action="store_true", help="one rate per workload and scenario, 400 requests")
    parser.add_argument(
        "--rates",
        metavar="LIST",
        help="comma list of rates (req/s): only the points at these rates of each workload's ladder",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds",
        metavar="LIST",
        help="comma list of seeds or ranges (0,1,2 or 0-9): every point at each, the ratios of the p90s averaged"
        " over them (default: --seed)",
    )
    parser.add_argument(
        "--settle-seeds",
        type=int,
        metavar="N",
        help="then run the points whose 95 %% interval over --seeds reaches across the 2 %% line (on either side)"
        " at further seeds, up to N in all, and take their ratios over all N (needs --seeds with at least"
        f" {MIN_SEEDS_FOR_INTERVAL})",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (default: one per core)"
    )
    parser.add_argument("--json", type=Path, help="write every run's summary and the ratios")
    parser.add_argument(
        "--cache", type=Path, metavar="DIR", help="keep runs in DIR and reuse those whose inputs did not change"
    )
    parser.add_argument("--png", type=Path, help="write p90 TTFT against the rate per workload, and per scenario")
    parser.add_argument("--markdown", type=Path, help="write the p90 tables and the ratios as Markdown (the docs')")


def _names(text: str, known: Sequence[str], what: str, groups: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    names = list(dict.fromkeys(n for name in flags.names(text) for n in (groups or {}).get(name, (name,))))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    return names


def run(args: argparse.Namespace) -> int:
    try:
        names = _names(args.workloads, list(EVAL_WORKLOADS), "workload", WORKLOAD_GROUPS)
        scenarios = _names(args.scenarios, list(SCENARIOS), "scenario")
        policies = flags.names(args.policies) + [f"config:{c}" for c in args.config]
        requests = args.requests if args.requests is not None else (400 if args.quick else 1500)
        if requests < 1 or not policies or args.jobs < 1:
            raise ValueError("need --requests >= 1, --jobs >= 1 and at least one policy")
        cache = RunCache(args.cache) if args.cache is not None else None
        seeds = (
            flags.numbers(args.seeds, "--seeds", int, least=0, ranges=True, distinct=True)
            if args.seeds is not None
            else [args.seed]
        )
        if args.settle_seeds is not None and not MIN_SEEDS_FOR_INTERVAL <= len(seeds) < args.settle_seeds:
            raise ValueError(
                f"--settle-seeds {args.settle_seeds}: needs at least {MIN_SEEDS_FOR_INTERVAL} --seeds, and more"
                " than --seeds gives"
            )
        only = set(flags.numbers(args.rates, "--rates", float, above=0)) if args.rates is not None else None
        workloads = [EVAL_WORKLOADS[n] for n in names]
        if only is not None and not any(
            rates_for(w, sc, quick=args.quick, only=only) for w in workloads for sc in scenarios
        ):
            raise ValueError(f"--rates {args.rates!r}: none of the chosen workloads runs at these rates")
    except (ValueError, OSError) as exc:
        print(f"picker bench lab-eval: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        by_seed = evaluate(
            workloads,
            policies,
            seeds=seeds,
            requests=requests,
            quick=args.quick,
            scenarios=scenarios,
            jobs=args.jobs,
            cache=cache,
            rates=only,
        )
    except (ValueError, OSError, errors.ConfigError) as exc:
        print(f"picker bench lab-eval: {exc}", file=sys.stderr)
        return 2
    results = by_seed[seeds[0]]
    all_ratios: list[Ratio] = []
    seed_ratios: dict[int, list[Ratio]] = {seed: [] for seed in seeds}
    for sc in scenarios:
        for w in workloads:
            rows = results.get((sc, w.name))
            if rows is None:  # no rate of --rates in its ladder
                continue
            for rate, at in lab_report.by_rate(rows).items():
                title = f"{w.name} at {rate:g} {w.unit} ({w.engines} engines, {sc}): {w.what}; {SCENARIOS[sc].what}"
                lab_report.print_rows(title if len(seeds) == 1 else f"{title} (seed {seeds[0]})", at)
            for seed in seeds:
                seed_ratios[seed] += ratios(w.name, by_seed[seed][(sc, w.name)], picker=args.focus, scenario=sc)
            runs_per_seed = [by_seed[seed][(sc, w.name)] for seed in seeds]
            all_ratios += mean_ratios(w.name, runs_per_seed, picker=args.focus, scenario=sc)
    added: dict[int, Results] = {}
    settled: list[Ratio] = []
    unsettled = [r for r in all_ratios if straddling(r)]
    if args.settle_seeds is not None and not unsettled:
        print(f"\nno point's interval reaches across the 2 % line over seeds {seed_text(seeds)}: nothing to settle")
    elif args.settle_seeds is not None:
        print(
            f"\nsettling {len(unsettled)} point(s) whose interval reaches across the 2 % line over seeds"
            f" {seed_text(seeds)}: every policy at {args.settle_seeds - len(seeds)} further seeds"
        )
        settled, added = settle(
            unsettled, by_seed, policies, total=args.settle_seeds, requests=requests, focus=args.focus,
            jobs=args.jobs, cache=cache,
        )  # fmt: skip
        again = {(r.scenario, r.workload, r.rate): r for r in settled}
        all_ratios = [again.get((r.scenario, r.workload, r.rate), r) for r in all_ratios]
    _print_ratios(all_ratios, seed_ratios)
    if added:
        print(f"({len(settled)} point(s) settled: their ratios are over seeds {seed_text([*seeds, *added])})")
    wall = time.perf_counter() - started
    runs = sum(len(r) for results_ in (*by_seed.values(), *added.values()) for r in results_.values())
    print(f"lab-eval: {runs} runs of {requests} requests in {wall:.0f} s wall ({args.jobs} jobs)")
    if args.json:
        doc = {
            "eval": {
                "requests": requests,
                "seed": seeds[0],
                "seeds": seeds,
                "settle_seeds": args.settle_seeds,
                "settled": [{"scenario": r.scenario, "workload": r.workload, "rate": r.rate} for r in settled],
                "policies": policies,
                "scenarios": {sc: SCENARIOS[sc].what for sc in scenarios},
                "quick": args.quick,
            },
            "workloads": {
                w.name: {
                    "what": w.what,
                    "rates": {sc: list(rates_for(w, sc, quick=args.quick, only=only)) for sc in scenarios},
                    "engines": w.engines,
                    "closed_loop": w.closed,
                    "engine": {
                        "preset": w.preset,
                        "num_gpu_blocks": w.engine.num_gpu_blocks,
                        "lora_adapters": list(w.engine.lora_adapters),
                        "max_loras": w.engine.max_loras,
                    },
                    "runs": [
                        {"scenario": sc, "seed": seed, **_run_json(r)}
                        for seed, results_ in (*by_seed.items(), *added.items())
                        for sc in scenarios
                        for r in results_.get((sc, w.name), [])
                    ],
                }
                for w in workloads
            },
            "ratios": [asdict(r) for r in all_ratios],  # of the p90s averaged over the seeds
            "within": {"mean": _count(all_ratios), **{str(seed): _count(seed_ratios[seed]) for seed in seeds}},
        }
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    if args.png:
        plot(results, args.png)
        print(f"wrote {args.png}")
    if args.markdown:
        args.markdown.write_text(markdown(workloads, scenarios, results, all_ratios, seeds, added=list(added)))
        print(f"wrote {args.markdown}")
    return 0


def markdown(
    workloads: Sequence[EvalWorkload],
    scenarios: Sequence[str],
    results: Results,
    rs: Sequence[Ratio],
    seeds: Sequence[int] = (0,),
    added: Sequence[int] = (),
) -> str:
    """The plain scenario: per workload, p90 TTFT by policy and rate (with the throughput in brackets where a
    policy served less than 90 % of the offered rate). The other scenarios: one table per workload, a column per
    scenario and rate. Then the ratios (``rs``; with several seeds, of the mean p90s, and the tables are the
    first seed's)."""
    out: list[str] = []
    if len(seeds) > 1:
        total = len(seeds) + len(added)
        settled = (
            f", and over seeds {seed_text([*seeds, *added])} at the points whose 95 % interval over the first"
            f" reached across the 2 % line (`--settle-seeds {total}`; their 'seeds behind' counts out of {total})"
            if added
            else ""
        )
        out += [f"Tables: seed {seeds[0]}. Ratios: p90 averaged over seeds {seed_text(seeds)}{settled}.", ""]
    if PLAIN in scenarios:
        for w in workloads:
            ran = {row.rate for row in results.get((PLAIN, w.name), [])}
            plain_cols = [((PLAIN, r), r) for r in rates_for(w, PLAIN, quick=False) if r in ran]
            if plain_cols:
                out += _table(f"**{w.name}** ({w.what}), TTFT p90:", plain_cols, results, w.name)
    for w in workloads:
        cols = [((sc, rate), rate) for sc in scenarios for rate in rates_for(w, sc, quick=False) if any(
            r.rate == rate and r.mix is not None for r in results.get((sc, w.name), []))]  # fmt: skip
        if cols:
            out += _table(
                f"**{w.name}**, short-request TTFT p90 / long-answer TPOT p90 / e2e p90:",
                cols,
                results,
                w.name,
                cell=_mix_cell,
            )
    for w in workloads:
        cols = [((sc, rate), rate) for sc in scenarios if sc != PLAIN for rate in sorted(
            {r.rate for r in results.get((sc, w.name), []) if r.rate is not None})]  # fmt: skip
        if cols:
            out += _table(f"**{w.name}** under the other scenarios, TTFT p90:", cols, results, w.name)
    met, total = _count(rs)
    out += [f"Within 2 % of the best other policy at {met} of {total} points.{_outside(rs)}", ""]
    spread = any(r.seeds is not None for r in rs)
    head = ["scenario", "workload", "req/s", "picker p90", "best other (p90)", "best / picker", "rr / picker"]
    head += ["seeds behind", "95 % interval", "lowest"] if spread else ["lowest"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rs:
        cells = f" {_behind(r)} | {_interval(r)} |" if spread else ""
        out.append(
            f"| {r.scenario} | {r.workload} | {_rate_text(r.workload, r.rate)} | {_fmt_s(r.picker_p90_s)} | "
            f"{r.best_baseline} ({_fmt_s(r.best_baseline_p90_s)}) | {r.vs_best:.2f}x | {r.vs_rr:.1f}x |{cells} "
            f"{verdict(r)} |"
        )
    return "\n".join(out) + "\n"


def _rate_text(workload: str, rate: float) -> str:
    w = EVAL_WORKLOADS.get(workload)
    return f"{rate:g} streams" if w is not None and w.closed else f"{rate:g}"


def _ttft_cell(row: lab_report.Row, scenario: str, rate: float) -> str:
    """p90 TTFT, with the throughput where the policy served less than 90 % of the offered rate."""
    s = row.summary
    cell = _fmt_s(s.ttft_s.p90)
    closed = row.result.spec.concurrency is not None
    if not closed and s.throughput_rps < 0.9 * rate * (1 - (EXTERNAL_SHARE if scenario.startswith("external") else 0)):
        cell += f" ({s.throughput_rps:.0f}/s)"  # not keeping up: say how much it served
    return cell


def _mix_cell(row: lab_report.Row, scenario: str, rate: float) -> str:
    m = row.mix
    if m is None:
        return "-"
    return f"{_fmt_s(m.short_ttft_s.p90)} / {m.long_tpot_s.p90 * 1e3:.1f} ms / {_fmt_s(m.e2e_s.p90)}"


def _table(
    title: str,
    cols: Sequence[tuple[tuple[str, float], float]],
    results: Results,
    workload: str,
    cell: Callable[[lab_report.Row, str, float], str] = _ttft_cell,
) -> list[str]:
    unit = EVAL_WORKLOADS[workload].unit if workload in EVAL_WORKLOADS else "req/s"
    head = [f"{rate:g} {unit}" if sc == PLAIN else f"{sc} {rate:g}" for (sc, rate), _ in cols]
    labels = list(dict.fromkeys(r.label for (sc, _), _ in cols for r in results[(sc, workload)]))
    out = [title, "", "| policy | " + " | ".join(head) + " |", "|---|" + "---|" * len(cols)]
    for label in labels:
        cells = []
        for (sc, rate), _ in cols:
            row = next((r for r in results[(sc, workload)] if r.label == label and r.rate == rate), None)
            if row is None:
                cells.append("-")
                continue
            text = cell(row, sc, rate)
            cells.append(f"**{text}**" if label == PICKER else text)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return [*out, ""]


def seed_text(seeds: Sequence[int]) -> str:
    """``0-9, 12`` for 0, 1, ..., 9, 12: runs of consecutive seeds as ranges, in the given order."""
    parts: list[str] = []
    start = prev = None
    for seed in [*seeds, None]:
        if prev is not None and seed == prev + 1:
            prev = seed
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = seed
    return ", ".join(parts)


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _behind(r: Ratio) -> str:
    return "-" if r.seeds is None else f"{r.seeds_behind}/{r.seeds}"


def _interval(r: Ratio) -> str:
    return "-" if r.interval is None else f"{r.interval[0]:.2f}-{r.interval[1]:.2f}"


def _outside(rows: Sequence[Ratio]) -> str:
    """Of the points outside 2 %, how many the seeds' intervals leave undecided (empty without intervals)."""
    out = [r for r in rows if not within(r)]
    if not out or all(r.interval is None for r in out):
        return ""
    undecided = sum(verdict(r) == "undecided" for r in out)
    return f" Of the {len(out)} outside, {undecided} undecided (95 % interval over the seeds reaching the 2 % line)."


def _count(rows: Sequence[Ratio]) -> tuple[int, int]:
    """(points within 2 % of the best other policy, points)."""
    return sum(within(r) for r in rows), len(rows)


def _print_ratios(rows: Sequence[Ratio], by_seed: Mapping[int, Sequence[Ratio]]) -> None:
    """The ratios (``rows``: of the p90s averaged over the seeds of ``by_seed``), then the count of points met."""
    if not rows:
        return
    seeds = list(by_seed)
    averaged = f" (p90 averaged over seeds {seed_text(seeds)})" if len(seeds) > 1 else ""
    print(f"\np90 TTFT of the focus policy{averaged}: vs the best other policy (>1 = focus lower) and vs round robin")
    spread = any(r.seeds is not None for r in rows)
    extra = f" {'behind':>7} {'95 % interval':>13}" if spread else ""
    print(
        f"  {'scenario':<16} {'workload':<20} {'req/s':>10} {'picker':>9} {'best other':>24} {'vs best':>8} "
        f"{'vs rr':>8}{extra}  lowest"
    )
    for r in rows:
        best = f"{r.best_baseline} {r.best_baseline_p90_s * 1e3:.0f} ms"
        cells = f" {_behind(r):>7} {_interval(r):>13}" if spread else ""
        print(
            f"  {r.scenario:<16} {r.workload:<20} {_rate_text(r.workload, r.rate):>10} "
            f"{r.picker_p90_s * 1e3:>6.0f} ms {best:>24} "
            f"{r.vs_best:>7.2f}x {r.vs_rr:>7.2f}x{cells}  {verdict(r)}"
        )
    met, total = _count(rows)
    if len(seeds) > 1:
        each = ", ".join(f"{_count(by_seed[seed])[0]} at seed {seed}" for seed in seeds)
        print(f"within 2 % of the best other policy: {met} of {total} points on the mean p90 ({each}).{_outside(rows)}")
    else:
        print(f"within 2 % of the best other policy: {met} of {total} points")

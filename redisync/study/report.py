"""``docs/ab/``: the plots and ``report.md`` of a study, built from its ``results.json`` alone (kept in
``records/ab/``).

The gate comes first. Claims follow the pre-registered tests only: a difference where the
Holm-corrected sign-flip test finds one, "no difference" only where the equivalence test does,
"inconclusive" otherwise; everything outside the primary family is labelled descriptive.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .plans.toy_dose_mechanism import DECISIONS, one_sided_sign_flip_p
from .plans.toy_mechanism_semantics import MARGIN_B, QUESTIONS, TIE, untied
from .stats import t_interval
from .study import GATE_SEEDS, MARGIN, PRIMARY_METRIC, SUMMARY_METRICS

COLORS = {
    "single": "black",
    "local": "tab:red",
    "pooled": "tab:blue",
    "weighted": "tab:green",
    "broadcast": "tab:purple",
    "uniform": "tab:brown",
    "per-profile": "tab:cyan",
    "local-paper": "salmon",
    "pooled-paper": "lightsteelblue",
    "local-16-shards": "darkred",
    "pooled-16-shards": "navy",
    "norm-local": "tab:orange",
}


PLAN_COMMIT = "16d6584"  # the commit of docs/ab/follow-up-plan.md, made before the follow-up's first run
SECOND_PLAN_COMMIT = "30c7625"  # the commit of docs/ab/second-follow-up-plan.md, before its first run


def write_report(results: dict[str, Any], out_dir: Path, command: str, pages: Path | None = None) -> Path:
    """results.json in ``out_dir`` (the record), the plots and report.md in ``pages`` (the page; default
    ``out_dir``); a study whose records hold the follow-up's results (``follow-up/results.json``) is
    led by the follow-up's answers."""
    pages = out_dir if pages is None else pages
    out_dir.mkdir(parents=True, exist_ok=True)
    pages.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    plots = [plot_completion(results, pages)]
    if results["runs"] and results.get("analysis"):
        plots.append(plot_mechanism(results, pages))
    lead = study_lead(out_dir) if not results.get("follow_up") and not results.get("second_follow_up") else []
    path = pages / "report.md"
    path.write_text(render_markdown(results, command, [p.name for p in plots], lead))
    return path


def study_lead(out_dir: Path) -> list[str]:
    """What leads the study of record: the follow-ups' answers, the latest first, from their folders."""
    second, first = out_dir / "second-follow-up" / "results.json", out_dir / "follow-up" / "results.json"
    lead = second_follow_up_lead(json.loads(second.read_text())) if second.is_file() else []
    return lead + (follow_up_lead(json.loads(first.read_text())) if first.is_file() else [])


def second_follow_up_lead(second: dict[str, Any]) -> list[str]:
    """The second follow-up's answers (those its runs allow so far), ahead of everything else."""
    if not second.get("second_follow_up"):
        return []
    planned = second.get("planned_runs")
    done = len(second["runs"])
    state = (
        ""
        if not planned
        else f" (all {planned} runs done)"
        if done >= planned
        else f" ({done} of its {planned} runs done)"
    )
    return [
        "## First: the second follow-up's answers" + state,
        f"Its report is [second-follow-up/report.md](second-follow-up/report.md)"
        f"{' (' + second['date'] + ')' if second.get('date') else ''}.",
        "",
        *second_follow_up_section(second["second_follow_up"], SECOND_PLAN_COMMIT)[1:],
    ]


def follow_up_lead(follow: dict[str, Any]) -> list[str]:
    """What the pre-registered follow-up answered, ahead of the study of record it followed."""
    if not follow.get("follow_up"):
        return []
    return [
        "## The pre-registered follow-up's answers",
        f"The follow-up asked when not syncing hurts; its plan and decision rules were committed in {PLAN_COMMIT} "
        f"([follow-up-plan.md](follow-up-plan.md)) before its first run, and its report is "
        f"[follow-up/report.md](follow-up/report.md){' (' + follow['date'] + ')' if follow.get('date') else ''}. "
        "These answers come first; the study of record below is what it followed.",
        "",
        *follow_up_section(follow["follow_up"])[3:],
    ]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _mean_curve(runs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    n = min(len(r["curve"]) for r in runs)
    steps = np.array([row["env_steps"] for row in runs[0]["curve"][:n]])
    return steps, np.mean([[row["completion"] for row in r["curve"][:n]] for r in runs], axis=0)


def plot_completion(results: dict[str, Any], out_dir: Path) -> Path:
    """Full-motion completion over training, mean over seeds: the gate's runs, then H and X."""
    plt = _pyplot()
    panels = [("gate (H)", results["gate_runs"])] + [
        (c, [r for r in results["runs"] if r["condition"] == c]) for c in ("H", "X")
    ]
    panels = [(title, runs) for title, runs in panels if runs]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (title, runs) in zip(axes[0], panels, strict=False):
        for arm in sorted({r["arm"] for r in runs}):
            steps, mean = _mean_curve([r for r in runs if r["arm"] == arm])
            ax.plot(steps, mean, color=COLORS.get(arm), label=arm)
        ax.set(
            title=f"{title}: full-motion completion (mean over seeds)",
            xlabel="env steps",
            ylabel="completion",
            ylim=(0, 1.02),
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "completion.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_mechanism(results: dict[str, Any], out_dir: Path) -> Path:
    """Per condition and arm: the share of env steps in skill segments, and the shards' and buffer's drift."""
    plt = _pyplot()
    per_arm = results["analysis"]["per_arm"]
    cells = sorted(per_arm)
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.35 * len(cells) + 2))
    y = np.arange(len(cells))
    axes[0].barh(y, [per_arm[c]["skill_share"] for c in cells], color=[COLORS.get(c.split("/")[1]) for c in cells])
    axes[0].set(yticks=y, yticklabels=cells, title="share of env steps in skill segments", xlabel="share")
    axes[1].barh(y - 0.2, [per_arm[c]["mean_drift_tv"] for c in cells], height=0.4, label="shards (mean)")
    axes[1].barh(y + 0.2, [per_arm[c]["mean_buffer_tv"] for c in cells], height=0.4, label="replay buffer (mixture)")
    axes[1].set(yticks=y, yticklabels=cells, title="TV distance from the pooled start distribution", xlabel="TV")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "mechanism.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.3g}"


def contrast_rows(contrasts: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| contrast | seeds | mean difference [95% t-interval] | sign-flip p | Holm p | 90% interval | "
        f"equivalence p (±{MARGIN}) | Holm p (equivalence) | detectable (80% power) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in contrasts:
        rows.append(
            f"| {c['name']} | {c['n']} | {c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}] | {_p(c['p_sign_flip'])} | "
            f"{_p(c['p_holm'])} | [{c['lo90']:+.3f}, {c['hi90']:+.3f}] | {_p(c['p_equivalence'])} | "
            f"{_p(c['p_equivalence_holm'])} | ±{c['detectable']:.3f} | **{c['verdict']}** |"
        )
    return rows


def _equivalence_p(c: dict[str, Any]) -> float:
    return c["p_equivalence_holm"] if c["p_equivalence_holm"] is not None else c["p_equivalence"]


def answer(c: dict[str, Any]) -> str:
    """One sentence for a contrast ``a − b``, from its verdict alone; an equivalence is stated with
    its 90 % interval (the one the equivalence test uses), a difference with its 95 % one."""
    condition, _, arms = c["name"].partition(": ")
    a, _, b = arms.partition(" − ")
    ci = f"{c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}] (95 %)"
    ci90 = f"{c['mean']:+.3f} [{c['lo90']:+.3f}, {c['hi90']:+.3f}] (90 %)"
    small = f", a difference within the equivalence margin ±{c['margin']}" if _equivalence_p(c) < 0.05 else ""
    return {
        "higher": f"on {condition}, `{a}` completes more of the motion than `{b}`: {ci} in completion AUC{small}",
        "lower": f"on {condition}, `{a}` completes less of the motion than `{b}`: {ci} in completion AUC{small}",
        "equivalent": f"on {condition}, `{a}` and `{b}` are equivalent within ±{c['margin']}: {ci90}",
        "inconclusive": f"on {condition}, `{a}` vs `{b}` is inconclusive at {c['n']} seeds (neither a difference nor "
        f"equivalence within ±{c['margin']}; with this spread only a difference of ±{c['detectable']:.2f} would "
        f"be found with 80 % power): {ci}",
    }[c["verdict"]]


def budget(results: dict[str, Any]) -> str:
    """The study's cost: its runs, their training time, and the wall time on its workers."""
    runs = results["gate_runs"] + results["runs"]
    workers = results.get("workers", 2)
    train_min = sum(r["wall_s"] for r in runs) / 60
    wall = results.get("wall_s")
    wall_text = f"{wall / 60:.0f} min wall" if wall else f"about {train_min / workers:.0f} min wall"
    planned = results.get("planned_runs")
    done = ""
    if planned:
        n = len(results["runs"])
        done = (
            f"; all {planned} planned runs done" if n >= planned else f"; {n} of the {planned} planned runs done so far"
        )
    return (
        f"- Budget: {len(runs)} runs ({len(results['gate_runs'])} of them the gate), {train_min:.0f} min of training "
        f"on {workers} workers side by side: {wall_text} on this 2-core machine{done}."
    )


TASK_CAVEAT = (
    "The task is a 2-D point mass tracking a Lissajous reference whose skill segments rotate the actuation by 90° "
    "(skill cannot transfer between segments by construction): a fair toy for start-frame allocation, not a proxy "
    "for humanoid tracking."
)

# What the product does after the first follow-up, read with ties: P1 shown, the rest not (see
# follow_up_section). P1's planned decision named a 256-env threshold that no run measured; the sampler
# warns from its own EMA's statistics instead.
FOLLOW_UP_PRODUCT = {
    "P1": "the sampler warns from its own failure EMA (failures per bin in its window, its uniform share) when a "
    "shard's EMA is poor while the fleet's pooled one would be fair; the 256-env threshold the plan named was not a "
    "measured boundary and is not used",
}


def _dz(x: float) -> str:
    return "—" if x != x else f"{x:+.2f}"


def effect_size(d: Sequence[float]) -> float:
    """dz: the mean per-seed difference over its standard deviation."""
    x = np.asarray(d, dtype=np.float64)
    sd = float(x.std(ddof=1)) if x.size >= 2 else 0.0
    return float(x.mean() / sd) if sd > 0 else float("nan")


def with_ties(hypotheses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first follow-up read with ties: a per-seed difference within the plateau jitter
    (`TIE`) counts as 0, the fixed sequence kept. (Its plan
    named no tie rule; the second follow-up's does, and this is that rule applied to the first.)"""
    out, open_ = [], True
    for h in hypotheses:
        d = np.asarray(h["differences"], dtype=np.float64)
        p = one_sided_sign_flip_p(untied(d), h["direction"])
        shown = open_ and p < 0.05
        out.append({"ties": int(np.sum(np.abs(d) <= TIE)), "p": p, "tested": open_, "shown": shown})
        open_ = shown
    return out


def follow_up_section(hypotheses: list[dict[str, Any]] | None) -> list[str]:
    """The pre-registered follow-up's answers, in their fixed sequence, each with its 95 % t-interval
    and effect size; as planned, and read with ties (what the product acts on)."""
    if not hypotheses:
        return []
    tied = with_ties(hypotheses)
    lines = [
        "## The follow-up's pre-registered answers (fixed sequence, α = 0.05)",
        "The plan, its hypotheses and what each outcome changes were committed before the first run "
        "(`docs/ab/follow-up-plan.md`, `redisync/study/plans/toy_dose_mechanism.py`). A hypothesis is tested only if every one "
        "before it was rejected; exact one-sided sign-flip tests on the per-seed differences in completion AUC "
        "(sampler α = 0.01). " + TASK_CAVEAT,
        "",
        "| | question | contrast | seeds | mean difference [95% t-interval] | effect size dz | one-sided p, as "
        f"planned | ties (within ±{TIE}) | p with ties as 0 | answer | final completion | steps to complete |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for h, t in zip(hypotheses, tied, strict=True):
        lo, hi = t_interval(h["differences"])
        answer = ("**shown**" if t["shown"] else "not shown") if t["tested"] else "descriptive (not tested)"
        sec = h["secondary"]
        lines.append(
            f"| {h['name']} | {h['question']} | {h['contrast']} ({h['direction']}) | {len(h['seeds'])} | "
            f"{h['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {_dz(effect_size(h['differences']))} | "
            f"{h['p_one_sided']:.3g} | {t['ties']} | {t['p']:.3g} | {answer} | {sec['final_completion']:+.3f} | "
            f"{sec['steps_to_complete']:+,.0f} |"
        )
    planned = [h["name"] for h in hypotheses if h["rejected"]]
    first_out = next((h for h, t in zip(hypotheses, tied, strict=True) if not t["shown"]), None)
    lines += [""]
    if first_out is not None:
        t = tied[hypotheses.index(first_out)]
        rest = [h["name"] for h in hypotheses[hypotheses.index(first_out) + 1 :]]
        lines.append(
            f"As planned, {', '.join(planned) or 'none'} {'was' if len(planned) == 1 else 'were'} rejected. The plan "
            f"named no rule for differences inside the plateau jitter ({TIE}: the 99th percentile, rounded up, of how "
            f"much completion moves while a run stays on one plateau); {t['ties']} of {first_out['name']}'s "
            f"{len(first_out['differences'])} are, and "
            f"with them counted as ties its p is {t['p']:.3g}: {first_out['name']} is not shown"
            + (f", and under the fixed sequence {' and '.join(rest)} are descriptive only." if rest else ".")
        )
        lines.append("")
    lines.append("What the product does:")
    for h, t in zip(hypotheses, tied, strict=True):
        if t["shown"]:
            lines.append(f"- {h['name']}: {FOLLOW_UP_PRODUCT.get(h['name'], DECISIONS[h['name']][0])}.")
        else:
            lines.append(f"- {h['name']}: {DECISIONS[h['name']][1]}.")
    return [*lines, ""]


def second_follow_up_section(rows: list[dict[str, Any]] | None, plan_commit: str | None = None) -> list[str]:
    """The second follow-up's answers, question by question, each contrast with its 95 % t-interval
    and effect size; a question whose runs are not all done is said to be running."""
    if not rows:
        return []
    lines = [
        "## The second follow-up's pre-registered answers (α = 0.05 per question)",
        "The plan, its tests, the tie rule and what each outcome changes were committed before the first run"
        + (f" ({plan_commit})" if plan_commit else "")
        + " (`docs/ab/second-follow-up-plan.md`, `redisync/study/plans/toy_mechanism_semantics.py`). "
        + f"A per-seed difference within ±{TIE} (the plateau jitter) counts as 0 in the sign-flip tests. "
        + TASK_CAVEAT,
        "",
    ]
    for q, question in QUESTIONS.items():
        mine = [r for r in rows if r["question"] == q]
        done = all(r["complete"] for r in mine)
        lines += [f"**{q} — {question}**" + ("" if done else " *(runs still going: not tested yet)*"), ""]
        lines += [
            "| contrast | seeds | mean difference [95% t-interval] | effect size dz | ties | test | answer |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in mine:
            if "verdict" in r:
                test = f"Holm p {r['p_holm']:.3g}; equivalence (±{MARGIN_B}) Holm p {r['p_equivalence_holm']:.3g}"
                answer = f"**{r['verdict']}**"
            elif "p_one_sided" in r:
                test = f"one-sided p {r['p_one_sided']:.3g}"
                answer = ("**shown**" if r["rejected"] else "not shown") if r["confirmatory"] else "descriptive"
            else:
                test, answer = "—", "descriptive" if not r["confirmatory"] else "running"
            mean = "—" if not r["seeds"] else f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
            lines.append(
                f"| {r['contrast']} | {len(r['seeds'])} | {mean} | {_dz(r['effect_size'])} | {r['ties']} | {test} | "
                f"{answer} |"
            )
        decisions = sorted({r["decision"] for r in mine if "decision" in r})
        if decisions:
            lines += ["", "What the product does:", *[f"- {d}." for d in decisions]]
        lines.append("")
    return lines


def tests_line(results: dict[str, Any]) -> str:
    """What the report's tests are, for the kind of study it reports."""
    if results.get("follow_up"):
        return (
            "exact one-sided sign-flip tests in a fixed sequence at α = 0.05 (no equivalence tests, no Holm: the "
            "sequence holds the family's error); each hypothesis with its 95% t-interval and effect size dz."
        )
    if results.get("second_follow_up"):
        return (
            f"per question at α = 0.05: A and C exact one-sided sign-flip tests, B exact two-sided sign-flip and TOST "
            f"within ±{MARGIN_B} (90% interval), each Holm-corrected over B's four; ties within ±{TIE} count as 0; "
            "each contrast with its 95% t-interval and effect size dz."
        )
    return (
        f"an exact sign-flip test, TOST equivalence within ±{MARGIN} with its 90% interval, Holm's correction over the "
        "primary family for both, a 95% t-interval and the difference detectable with 80% power."
    )


def render_markdown(results: dict[str, Any], command: str, plots: list[str], lead: list[str] | None = None) -> str:
    cfg, g = results["config"], results["gate"]
    task = cfg["task"]
    lines = [
        "# Does curriculum drift between collector shards hurt training?",
        "",
        f"Produced by `{command}`{' on ' + results['date'] if results.get('date') else ''}; every figure below comes "
        "from its `results.json`, kept with the study's run records under `records/ab/`.",
        "",
        *(lead or []),
        "## The gate (fixed before the study)",
        f"On H, one unsharded adaptive collector (`single`) must beat uniform start frames (`uniform`) by at least "
        f"{g['threshold']} in the primary metric (completion AUC) over the gate's seeds {list(GATE_SEEDS)}; otherwise "
        "the task cannot tell curricula apart and the study stops.",
        "",
        "| seed | single | uniform | difference |",
        "|---|---|---|---|",
        *[
            f"| {GATE_SEEDS[i] if i < len(GATE_SEEDS) else i} | {s:.3f} | {u:.3f} | {s - u:+.3f} |"
            for i, (s, u) in enumerate(zip(g["single"], g["uniform"], strict=False))
        ],
        "",
        f"Mean difference **{g['mean_difference']:+.3f}**: the gate **{'passed' if g['passed'] else 'FAILED'}**.",
        "",
        *follow_up_section(results.get("follow_up")),
        *second_follow_up_section(results.get("second_follow_up"), SECOND_PLAN_COMMIT),
        "## Set-up",
        f"- Task: {results['env']}. A {task['bins']} s reference motion at 50 Hz ({task['bins']} one-second bins) with "
        f"{task['skill_segments']} skill segments per profile in which the actuation is rotated (±{task['skill_angle_deg']:g}°, "
        f"strength ×{task['skill_gain']:g}); the policy sees the current and upcoming segment kind and its profile. "
        f"Episodes of {task['episode_s']:g} s from sampled starts; a fall (error > {task['tolerance']} m) ends one and is a "
        "failure in its bin.",
        "- Conditions: **H** — every shard the same env distribution (one profile); **X** — "
        f"{task['profiles']} profiles with skill segments of their own, shard s runs profile s mod {task['profiles']}, "
        "and a profile-specific observation offset.",
        f"- Fleet: {cfg['shards']} shards × {cfg['envs_per_shard']} envs (`single`: one collector with all of them; "
        "`*-16-shards`: 16 shards sharing the same envs), each shard with its own store connection and "
        + (results.get("sync") or "`Syncer`")
        + "; sampler EMA "
        f'α = {cfg["sampler_alpha"]}, ε = 0.1, `uniform_mix="code"` unless the arm says `paper`.',
        f"- Learner: FastSAC-style SAC, hidden {cfg['sac']['hidden']}, batch {cfg['sac']['batch_size']}, "
        f"{cfg['updates_per_step']} updates per fleet step, a replay buffer of {cfg['sac']['buffer_size']:,} transitions; "
        f"{cfg['env_steps']:,} env steps per run. How the task and budget were tuned until the gate passed: "
        f"[pilots.md]({'../' if results.get('follow_up') or results.get('second_follow_up') else ''}pilots.md).",  # (a follow-up's report: one folder down)
        f"- Evaluation every {cfg['eval_every']:,} env steps: {cfg['eval_rollouts']} rollouts per profile of the "
        "deterministic policy from frame 0 through the whole motion; completion = share tracked before the first fall.",
        f"- Primary metric `{PRIMARY_METRIC}`: the mean completion over the run's evaluations. Arms share seeds "
        "(same networks, env noise and generators), so contrasts are paired by seed: " + tests_line(results),
        budget(results),
        "",
    ]
    if not g["passed"]:
        lines += [
            "## Result",
            "The gate failed, so no comparison of sync modes is reported: on this task the curriculum "
            "does not matter enough for any way of syncing it to show. Retune the task (never the gate) and run again.",
            "",
        ]
        lines += [f"![{p}]({p})" for p in plots]
        return "\n".join(lines) + "\n"
    analysis = results["analysis"]
    if analysis is None:  # the gate alone, or the follow-up (its answers lead the report)
        lines += [f"![{p}]({p})" for p in plots]
        return "\n".join(lines) + "\n"
    primary = analysis["primary"]
    lines += ["## Primary contrasts (pre-registered)", "", *contrast_rows(primary), "", "## Answers", ""]
    for condition, title in (("H", "H — identical shards"), ("X", "X — different shards")):
        lines.append(f"**{title}.**")
        for c in primary:
            if c["name"].startswith(condition + ":"):
                lines.append(f"- {answer(c)}.")
        lines.append("")
    lines += [
        "## Secondary contrasts (descriptive, no correction)",
        "",
        *contrast_rows(analysis["secondary"]),
        "",
        "## Per arm (descriptive, means over seeds)",
        "",
        "| condition/arm | seeds | " + " | ".join(SUMMARY_METRICS) + " |",
        "|---|---|" + "---|" * len(SUMMARY_METRICS),
    ]
    for cell, row in sorted(analysis["per_arm"].items()):
        lines.append(f"| {cell} | {row['seeds']} | " + " | ".join(f"{row[m]:.3g}" for m in SUMMARY_METRICS) + " |")
    lines += ["", "Metrics: " + "; ".join(f"`{m}`: {d}" for m, (d, _) in SUMMARY_METRICS.items()) + ".", ""]
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"

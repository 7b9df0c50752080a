"""``docs/ab/``: the plots and ``report.md`` of a study, built from its ``results.json`` alone.

The conclusion is written from the intervals: a difference is called a difference only when its
95% interval excludes zero, and otherwise reported as not detected at this number of seeds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .stats import Interval, diff_ci, mean_ci
from .study import SUMMARY_METRICS

COLORS = {"single": "black", "local": "tab:red", "pooled": "tab:blue", "weighted": "tab:green",
          "broadcast": "tab:purple", "local+norm-local": "tab:orange", "pooled+norm-local": "tab:cyan", "uniform": "tab:brown"}


def write_report(results: dict[str, Any], out_dir: Path, command: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    plots = [plot_learning_curves(results, out_dir), plot_survival_heatmap(results, out_dir), plot_drift(results, out_dir)]
    path = out_dir / "report.md"
    path.write_text(render_markdown(results, command, [p.name for p in plots]))
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _curves(results: dict[str, Any], arm: str, value: Any) -> tuple[np.ndarray, np.ndarray]:
    runs = [r for r in results["runs"] if r["arm"] == arm]
    steps = np.array([row["env_steps"] for row in runs[0]["curve"]])
    n = min(len(r["curve"]) for r in runs)
    return steps[:n], np.array([[value(row) for row in r["curve"][:n]] for r in runs])


def _band(ax: Any, steps: np.ndarray, values: np.ndarray, arm: str) -> None:
    cis = [mean_ci(values[:, i]) for i in range(values.shape[1])]
    ax.plot(steps, [c.mean for c in cis], color=COLORS.get(arm), label=arm)
    ax.fill_between(steps, [c.lo for c in cis], [c.hi for c in cis], color=COLORS.get(arm), alpha=0.15)


def plot_learning_curves(results: dict[str, Any], out_dir: Path) -> Path:
    plt = _pyplot()
    hard = results["hard_bins"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm in results["arms"]:
        _band(axes[0], *_curves(results, arm, lambda row: row["return"]), arm)
        _band(axes[1], *_curves(results, arm, lambda row: float(np.mean([row["survival"][b] for b in hard]))), arm)
    axes[0].axhline(results["random"]["return"], color="grey", ls=":", label="random policy")
    axes[1].axhline(results["config"]["survival_threshold"], color="grey", ls=":", label="threshold")
    axes[0].set(title="evaluation return (mean, 95% CI over seeds)", xlabel="env steps", ylabel="return")
    axes[1].set(title=f"survival on the hardest bins {hard}", xlabel="env steps", ylabel="survival", ylim=(0, 1.02))
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    return _save(plt, fig, out_dir / "learning_curves.png")


def plot_survival_heatmap(results: dict[str, Any], out_dir: Path) -> Path:
    plt = _pyplot()
    arms = results["arms"]
    grid = np.array([np.mean([np.mean([row["survival"] for row in r["curve"][-3:]], 0)
                              for r in results["runs"] if r["arm"] == arm], 0) for arm in arms])
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * grid.shape[1] + 3), 0.5 * len(arms) + 1.8))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_yticks(range(len(arms)), arms)
    ax.set_xticks(range(grid.shape[1]))
    for b in results["hard_bins"]:
        ax.get_xticklabels()[b].set_color("red")
    ax.set(xlabel="motion bin (red: hardest)", title="final per-bin survival, mean over seeds")
    fig.colorbar(im, ax=ax, fraction=0.03)
    return _save(plt, fig, out_dir / "survival_heatmap.png")


def plot_drift(results: dict[str, Any], out_dir: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in results["arms"]:
        runs = [r for r in results["runs"] if r["arm"] == arm and r["shards"] > 1 and r["drift"]]
        if not runs:
            continue
        n = min(len(r["drift"]) for r in runs)
        steps = np.array([d["env_steps"] for d in runs[0]["drift"][:n]])
        values = np.array([[float(np.mean(d["tv"])) if d["tv"] else 0.0 for d in r["drift"][:n]] for r in runs])
        _band(ax, steps, values, arm)
    ax.set(title="shard drift: TV(shard's sampling distribution, pooled)", xlabel="env steps", ylabel="mean TV over shards")
    ax.legend(fontsize=8)
    return _save(plt, fig, out_dir / "drift.png")


def _fmt(ci: dict[str, float], digits: int = 3) -> str:
    return f"{ci['mean']:.{digits}g} [{ci['lo']:.{digits}g}, {ci['hi']:.{digits}g}]"


TRAINING_METRICS = ("final_return", "mean_return", "final_survival", "final_hard_survival", "steps_to_threshold")


def _better(metric: str, ci: dict[str, float]) -> bool | None:
    """True/False when the interval of ``a − b`` excludes zero in a better/worse direction; None if it does not."""
    if not Interval(**ci).excludes_zero():
        return None
    return (ci["mean"] > 0) == SUMMARY_METRICS[metric][1]


def _versus(results: dict[str, Any], a: str, b: str) -> dict[str, dict[str, float]]:
    """``a − b`` per training metric, seeds bootstrapped within each arm."""
    values = {arm: [r["summary"] for r in results["runs"] if r["arm"] == arm] for arm in (a, b)}
    return {m: diff_ci([v[m] for v in values[a]], [v[m] for v in values[b]]).to_dict() for m in TRAINING_METRICS}


def _describe(a: str, b: str, diffs: dict[str, dict[str, float]], per_arm: dict[str, Any]) -> str:
    parts = []
    for m, ci in diffs.items():
        verdict = _better(m, ci)
        if verdict is not None:
            base = abs(per_arm[b][m]["mean"]) or 1.0
            parts.append(f"{'better' if verdict else 'worse'} on {m} by {_fmt(ci)} ({100 * ci['mean'] / base:+.1f}% of `{b}`'s mean)")
    if not parts:
        widest = max(diffs.items(), key=lambda kv: abs(kv[1]["hi"] - kv[1]["lo"]) / (abs(per_arm[b][kv[0]]["mean"]) or 1.0))
        return (f"`{a}` and `{b}` differ on no training metric with a 95% interval that excludes zero "
                f"(e.g. final return {_fmt(diffs['final_return'])}, hardest-bin survival {_fmt(diffs['final_hard_survival'])}; "
                f"the widest relative interval is on {widest[0]})")
    return f"`{a}` vs `{b}`: " + "; ".join(parts)


def render_markdown(results: dict[str, Any], command: str, plots: list[str]) -> str:
    cfg, summary = results["config"], results["summary"]
    arms, ref = results["arms"], summary["reference"]
    per_arm, diffs = summary["per_arm"], summary["differences"]
    seeds = len(results["seeds"])
    task = cfg["task"]
    lines = [
        "# A/B study: does curriculum drift between collector shards hurt training?",
        "",
        "## Question",
        "When every collector shard adapts its curriculum state on its own, one policy is trained on N different",
        "start-frame distributions and N different observation normalisations. Does that hurt convergence or",
        "sample efficiency, and which sync mode of redisync is best?",
        "",
        "## Set-up",
        f"- Task: {results['env']}; a {task['bins']} s reference motion at 50 Hz ({task['bins']} bins), "
        f"hardest bins {results['hard_bins']} (fast segments, tighter tolerance); {task['profiles']} perturbation profiles "
        f"with pushes in bins of their own (heterogeneity {task['heterogeneity']}); a fall ends the episode and counts as "
        f"a failure in its bin; reward exp(-err²/σ²).",
        f"- Fleet: {cfg['shards']} shards × {cfg['envs_per_shard']} envs (shard i owns profile i); `single` is one "
        f"collector with all {cfg['shards'] * cfg['envs_per_shard']} envs, the profiles mixed. Every shard has its own "
        f"store connection and Syncer; store: {results['store']}.",
        f"- Learner: FastSAC-style SAC (twin Q, Polyak targets, tanh-Gaussian actor, automatic entropy), hidden "
        f"{cfg['sac']['hidden']}, batch {cfg['sac']['batch_size']}, {cfg['updates_per_step']} updates per fleet step, "
        f"policy republished every {cfg['republish_every']} updates; {cfg['env_steps']:,} env steps per run; "
        f"sampler EMA α = {cfg['sampler_alpha']}.",
        f"- Evaluation: every {cfg['eval_every']:,} env steps, the deterministic policy from a fixed uniform set of "
        f"{cfg['eval_starts_per_bin']} starts per bin and profile, {cfg['eval_horizon']} steps each; survival = no fall.",
        f"- {seeds} seeds per arm; means with 95% percentile-bootstrap intervals over seeds; differences against "
        f"`{ref}` bootstrap both arms' seeds.",
        "",
        "Arms: `single` (ideal pool), `local` (no sync), `pooled` (merge of own EMAs, the default), `weighted` "
        "(failure-weighted mean of blended EMAs), `broadcast` (shard 0's EMA wins); the `+norm-local` arms keep "
        "each shard's observation normaliser to itself (every other arm pools it); `uniform`, the control, samples "
        "start frames uniformly (no adaptive curriculum).",
        "",
        "## Figures (mean [95% CI] over seeds)",
        "",
        f"A random policy scores return {results['random']['return']:.3g} and hardest-bin survival "
        f"{results['random']['final_hard_survival']:.3g} on the same evaluation set.",
        "",
        "| arm | " + " | ".join(SUMMARY_METRICS) + " |",
        "|---" * (len(SUMMARY_METRICS) + 1) + "|",
    ]
    for arm in arms:
        if arm in per_arm:
            lines.append(f"| `{arm}` | " + " | ".join(_fmt(per_arm[arm][m]) for m in SUMMARY_METRICS) + " |")
    lines += ["", "Metrics: " + "; ".join(f"`{m}`: {d}" for m, (d, _) in SUMMARY_METRICS.items()) + ".", "",
              f"Runs that reached the survival threshold ({cfg['survival_threshold']}) on the hardest bins: "
              + ", ".join(f"`{a}` {per_arm[a]['reached_threshold']['mean'] * seeds:.0f}/{seeds}" for a in arms if a in per_arm) + ".",
              "", f"### Differences from `{ref}` (arm − {ref}, mean [95% CI])", "",
              "| arm | " + " | ".join(SUMMARY_METRICS) + " |", "|---" * (len(SUMMARY_METRICS) + 1) + "|"]
    for arm in arms:
        if arm in diffs:
            lines.append(f"| `{arm}` | " + " | ".join(_fmt(diffs[arm][m]) for m in SUMMARY_METRICS) + " |")
    lines += ["", *[f"![{p}]({p})" for p in plots], "", "## Conclusion", ""]
    lines += conclusion(results)
    lines += ["", "## Reproduce", "", "From a fresh clone, after `scripts/setup` (and `scripts/ensure-redis` for a `--url` on this machine):",
              "", "```", command, "```", "",
              "Wall-clock per run: " + ", ".join(f"`{a}` {per_arm[a]['wall_s']['mean']:.0f} s" for a in arms if a in per_arm) + "."]
    return "\n".join(lines) + "\n"


def conclusion(results: dict[str, Any]) -> list[str]:
    """What the intervals support: a difference only where its 95% interval excludes zero."""
    summary = results["summary"]
    per_arm, arms, seeds = summary["per_arm"], results["arms"], len(results["seeds"])
    out = []
    drift = {a: per_arm[a]["mean_drift_tv"] for a in per_arm}
    if "local" in drift and "pooled" in drift:
        line = (f"- **Drift is real.** Unsynced (`local`) shards sample from distributions at TV {_fmt(drift['local'])} from "
                f"the pooled one over a run, `pooled` shards at {_fmt(drift['pooled'])}")
        line += "".join(f", `{a}` at {_fmt(drift[a])}" for a in ("weighted", "broadcast") if a in drift)
        out.append(line + ". What remains under `pooled` is the sync lag: a shard applies the others' state at its next "
                   "reset boundary after a pull, and the probe compares slots published a few steps apart.")
        buffer = {a: per_arm[a]["mean_buffer_tv"] for a in ("local", "broadcast") if a in per_arm}
        if buffer:
            out.append("- **The replay buffer sees less of it.** Every shard feeds the one buffer, so it receives the mixture of "
                       "the shards' distributions: " + ", ".join(f"TV {_fmt(v)} from the pooled one under `{a}`" for a, v in buffer.items())
                       + (f": the mixture keeps {100 * buffer['local']['mean'] / drift['local']['mean']:.0f}% of an unsynced shard's "
                          "drift (the shards' drifts partly cancel), while a broadcast owner's distribution reaches the buffer whole."
                          if "local" in buffer else "."))
    pairs = [(a, b) for a, b in (("local", "pooled"), ("local", "single"), ("pooled", "single")) if a in per_arm and b in per_arm]
    if pairs:
        out.append("- **Does drift hurt training?** " + ". ".join(_describe(a, b, _versus(results, a, b), per_arm) for a, b in pairs) + ".")
    if "uniform" in per_arm and "pooled" in per_arm:
        out.append("- **Does the adaptive curriculum matter at all on this task?** " + _describe("uniform", "pooled", _versus(results, "uniform", "pooled"), per_arm)
                   + ". Where uniform start frames do as well as the adaptive sampler, no way of syncing the sampler can matter much.")
    others = [a for a in arms if a not in ("local", "pooled", "single", "uniform") and a in per_arm and "pooled" in per_arm]
    if others:
        out.append("- **Other sync modes against `pooled`:** " + ". ".join(_describe(a, "pooled", _versus(results, a, "pooled"), per_arm)
                                                                          for a in others) + ".")
    ranked = sorted((a for a in arms if a in per_arm and a != "uniform"), key=lambda a: -per_arm[a]["mean_return"]["mean"])
    if ranked:
        best = ranked[0]
        ties = [a for a in ranked[1:] if _better("mean_return", _versus(results, a, best)["mean_return"]) is None]
        out.append(f"- **Which sync is best?** By return over the whole run (sample efficiency) `{best}` ranks first; "
                   + (f"{', '.join(f'`{a}`' for a in ties)} cannot be told apart from it at {seeds} seeds" if ties
                      else "every other arm is worse with an interval that excludes zero") + ".")
    overhead = per_arm.get("pooled", {}).get("sync_overhead_pct")
    if overhead:
        out.append(f"- **Cost.** Sync calls take {_fmt(overhead)}% of the collectors' collection time under `pooled` "
                   "(wall-clock on the collector thread around `on_step` and `at_reset_boundary`, which includes waiting "
                   "for the GIL while the shards' sync threads — all in one process here — decode replies; see the "
                   "README's benchmarks for one collector per process).")
    out.append(f"- **Caveats.** {seeds} seeds per arm; percentile-bootstrap intervals from few seeds tend to be too narrow, "
               "so an interval that only just excludes zero is weak evidence. One task, one fleet size, one heterogeneity.")
    return out

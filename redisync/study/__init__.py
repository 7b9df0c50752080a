"""The drift study: when does curriculum drift between collector shards hurt training? Research code.

Where things are:

- **the tasks**: `task` (a point mass tracking a long motion with rare skill segments: the toy
  studies'), `walker` (a planar MuJoCo walker: the walker plans');
- **one training run**: `fleet` (N collector shards feeding one SAC learner, synced per arm),
  `learner` (the SAC learner; `pendulum` checks it on gymnasium's Pendulum), `evaluation`;
- **running a plan**: `runner` (a plan's stages: runs kept as they finish, the summary after each;
  the walker plans are stages it runs; the toy plans after their gate are data),
  `study.run_cells` (the runs of a set of cells in worker processes, resumable), `provenance` (what a
  run file records of where it came from);
- **the plans** (`plans`: one module each, named by what it asks; `plans.PLANS` gives each plan's id for
  ``redisync ab --plan``, and the commit and paths it was registered as, which the committed plans and
  reports cite): `study` (the first, on the toy task, and the toy plans' runner), `plans.toy_dose_mechanism`
  (dose, mechanism, heterogeneity), `plans.toy_mechanism_semantics` (the mechanism, the seed's semantics
  question, where the harm ends), `plans.walker_ema_window` (real physics, and whether the EMA's window
  decides), `plans.walker_contrast` (a walker that can learn: pilots, gate, contrast),
  `plans.walker_fleet_shapes` (when drift hurts: fleet shapes of low and high measured drift);
  `warning_calibration` and `drift_calibration` (the drift warning's rules against measured harm);
- **judging them**: `stats` (the pre-registered paired statistics), `report` (``docs/ab/``'s plots
  and reports, from a study's results alone).
"""

"""The drift study: when does curriculum drift between collector shards hurt training? Research code.

Where things are:

- **the tasks**: `task` (a point mass tracking a long motion with rare skill segments: the toy
  studies'), `walker` (a planar MuJoCo walker: the third and fourth studies');
- **one training run**: `fleet` (N collector shards feeding one SAC learner, synced per arm),
  `learner` (the SAC learner; `pendulum` checks it on gymnasium's Pendulum), `evaluation`;
- **running a plan**: `runner` (a plan's stages: runs kept as they finish, the summary after each;
  the third and fourth studies are stages it runs; the toy studies' plans after their gate are data),
  `study.run_cells` (the runs of a set of cells in worker processes, resumable), `provenance` (what a
  run file records of where it came from);
- **the plans, in the order they ran** (each module holds its plan's arms, seeds, tests and decisions;
  the committed plans and reports in ``docs/ab/`` cite these modules by these names at the commits
  that fixed them, so the names stay): `study` (the first, on the toy task), `follow_up` (dose,
  mechanism, heterogeneity), `second_follow_up` (the mechanism, the seed's semantics question, where
  the harm ends), `third_study` (real physics, and whether the EMA's window decides), `fourth_study`
  (a walker that can learn: pilots, gate, contrast), `warning_calibration` (the drift warning's rule
  against measured harm);
- **judging them**: `stats` (the pre-registered paired statistics), `report` (``docs/ab/``'s plots
  and reports, from a study's results alone).
"""

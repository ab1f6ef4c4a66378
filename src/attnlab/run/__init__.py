"""The run skeleton: a recipe (:mod:`.recipe`), the task protocol and registry (:mod:`.task`), a
finished run (:mod:`.trained`), the one training skeleton (:mod:`.skeleton`: train, load_run),
the run directory's claim and files (:mod:`.claim`, :mod:`.files`), the weights a run starts from
(:mod:`.weights`) and what a task shows, as data (:mod:`.views`). It names no task: the tasks
(:mod:`attnlab.tasks`) fill in its protocol and register by name."""

"""The trained-model runs the chapters read: ``python -m experiments {copying,extension,forgetting}``.

``copying`` is Chapter 6's selective copying, ``extension`` Chapter 11's context extension and
``forgetting`` Chapter 12's cache policies. Each study module has ``SIZES`` (its settings by name),
``run_experiment(settings, jobs=, progress=)`` and ``job_count(settings)``; ``__main__`` is the one
command line, which records the run with ``longctx.support.timed_run`` and writes it to
``experiments/results/<study>-<device>[-<size>].json``.
"""

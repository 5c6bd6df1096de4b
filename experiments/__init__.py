"""The trained-model runs the chapters read: Chapter 4's selective copying (``experiments.copying``),
Chapter 6's context extension (``python -m experiments``) and Chapter 7's cache policies
(``experiments.forgetting``)."""

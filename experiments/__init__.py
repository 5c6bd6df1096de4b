"""Chapter 6's experiment: stretching a trained rotary TinyGPT's context (``python -m experiments``)."""

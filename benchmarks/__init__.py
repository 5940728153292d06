"""Side-by-side benchmarks of tensorstream against the tools a user would otherwise pick.

Run ``python -m benchmarks.run --help`` from the repository root. Method: each
contender runs in its own fresh process, contenders alternate round by round,
every result is verified, and ratios (not absolute speeds) are what we claim.
See ``docs/benchmarks.md``.
"""

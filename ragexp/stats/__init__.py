"""Pure statistics, numpy only, nothing of runs or stores: paired differences with their
sign-flip test and interval (:mod:`~ragexp.stats.paired`), corrections for many comparisons
(:mod:`~ragexp.stats.multiple`), anytime-valid confidence sequences
(:mod:`~ragexp.stats.sequential`), paired deltas by stratum (:mod:`~ragexp.stats.strata`) and the
2x2 stage attribution (:mod:`~ragexp.stats.attribution`)."""

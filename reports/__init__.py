"""Reports: tables and plots from simulated and measured runs."""

# The drafter of the published PR #32374 profile (policies/profiles, EAGLE-1), for the KV
# lookahead vLLM's scheduler reserves: the PR's format does not record it, so a simulated report
# on that profile names it, else its runs would take RunConfig's default (ngram).
PR_SPECULATIVE_METHOD = "eagle"

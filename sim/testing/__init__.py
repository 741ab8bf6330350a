"""Test machinery shipped with the simulator: the stateful property-test machine of the
scheduler's accounting (`machine`), the naive reference scheduler it compares against
(`reference`), and small deterministic executors and policies (`fakes`). The simulator itself
never imports it; tests, benchmarks and checks of users' policies do."""

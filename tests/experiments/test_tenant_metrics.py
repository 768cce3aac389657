"""The run summary's fairness line (experiments.run.tenant_rows)."""


def test_the_summary_line_says_when_no_tenants_competed():
    """With no window of two backlogged tenants there is no fairness figure to give: the line says why (the
    load is below capacity) instead of printing a blank index."""
    from experiments.run import tenant_rows
    quiet = {"metrics": {"jain_index": None, "num_backlogged_windows": 0, "jain_index_overall": 0.4866}}
    (label, text), = tenant_rows(quiet)
    assert label == "fairness" and "no window with two tenants backlogged" in text and "0.4866" in text
    # the figures servelab-report's table shows, by its column names, blank here and how to get them
    assert text.startswith("jain_index -, service_diff_rate_mean -") and "experiment=fcfs_vs_vtc" in text
    busy = {"metrics": {"jain_index": 0.99, "num_backlogged_windows": 12, "jain_index_overall": 0.9,
                        "service_diff_rate_max": 490.0, "service_diff_rate_mean": 210.0}}
    text = tenant_rows(busy)[0][1]
    assert "over 12 backlogged windows" in text
    assert text.startswith("jain_index 0.99, service_diff_rate_mean 210 tok/s (max 490 tok/s)")
    assert "jain_index_overall 0.9" in text


def test_one_tenant_queued_alone_is_not_called_a_light_load():
    """A heavy tenant queued for half the run beside one served as it asks (VTC with a light tenant): no window has
    two tenants backlogged, and the line used to say "the load is below what the GPU serves", which the heavy
    tenant's queueing contradicts. It now names the tenant that queued and in how many windows."""
    from engine.core.recorder import Recorder
    from experiments.run import tenant_rows
    from experiments.tenant_metrics import fairness_summary
    from tests.experiments.test_tenants import _finished
    rec = Recorder()
    _finished(0, "heavy", 0.0, 60.0, 62.0, 5, rec=rec)          # first scheduled at 30 s: queued through [0, 30)
    for i in range(1, 31):
        _finished(i, "light", 2.0 * i, 0.01, 0.5, 3, rec=rec)   # served as it comes
    m = fairness_summary(rec.requests_frame())
    assert m["num_backlogged_windows"] == 0 and m["num_windows"] == 60
    assert 25 <= m["num_windows_any_backlogged"] <= 30
    assert m["backlogged_tenants"] == f"heavy: {m['num_windows_any_backlogged']}"
    (label, text), = tenant_rows({"metrics": m})
    assert label == "fairness" and "below what the GPU serves" not in text
    assert f"only one at a time had requests waiting through a whole window (heavy: {m['num_windows_any_backlogged']}"\
           " of the 60 windows of" in text
    idle = {**m, "num_windows_any_backlogged": 0, "backlogged_tenants": ""}
    assert "no tenant had a request waiting through any of the 60 windows" in tenant_rows({"metrics": idle})[0][1]

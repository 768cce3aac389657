"""The run summary's fairness line (experiments.run.tenant_rows)."""


def test_the_summary_line_says_when_no_tenants_competed():
    """With no window of two backlogged tenants there is no fairness figure to give: the line says why (the
    load is below capacity) instead of printing a blank index."""
    from experiments.run import tenant_rows
    quiet = {"metrics": {"jain_index": None, "num_backlogged_windows": 0, "jain_index_overall": 0.4866}}
    (label, text), = tenant_rows(quiet)
    assert label == "fairness" and "no window with two tenants backlogged" in text and "0.4866" in text
    busy = {"metrics": {"jain_index": 0.99, "num_backlogged_windows": 12, "jain_index_overall": 0.9,
                        "service_diff_rate_max": 490.0}}
    assert "over 12 backlogged windows" in tenant_rows(busy)[0][1]

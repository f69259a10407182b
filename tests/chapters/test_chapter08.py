"""The sweep page runs a real (smoke-sized) sweep of chapter 4 end to end."""



def test_sweeping_page_smoke(smoke_run):
    r = smoke_run(8)
    data = r.claims  # the run's claims JSON (smoke_run asserts it is not enforced)
    values = {c["id"]: c["value"] for c in data["claims"]}
    assert values["sweep-complete"] == 2 and values["sweep-table"] == 2

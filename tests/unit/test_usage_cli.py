"""`slicex usage` on a home's store without a running deployment: dates or RFC 3339 times bound the period,
a reversed period or an unreadable time is refused plainly, and the CSV holds what the table shows."""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from cli.main import main
from operations.accounting import UsageRecord
from operations.ledger import USAGE
from resources.kind import Amounts
from slicex.codec import encode
from slicex.store import open_store

ALICE = "urn:publicid:IDN+t.org+user+alice"
T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    store_url = f"sqlite:///{tmp_path / 'state.db'}"
    (tmp_path / "slicex.yaml").write_text(yaml.safe_dump({"authority": "t.org", "store": store_url}))
    store = open_store(store_url)
    for i, hours in enumerate((2, 30)):  # 2 cores for 2 h on Jan 1; 1 core from Jan 1 for 30 h
        rec = UsageRecord(f"urn:publicid:IDN+t.org+sliver+{i}", "urn:publicid:IDN+t.org:p+slice+s", ALICE,
                          "node", f"n{i}", Amounts(cores=2 - i, nodes=1), T0, None, T0 + timedelta(hours=hours),
                          "deleted", project="urn:publicid:IDN+t.org+project+p")
        store.put(USAGE, rec.sliver_urn, encode(rec))
    store.close()
    return tmp_path


def test_a_day_of_usage_by_date_and_the_csv_agrees(home: Path, capsys):
    assert main(["--home", str(home), "usage", "--from", "2030-01-01", "--to", "2030-01-02",
                 "--csv", str(home / "u.csv")]) == 0
    out = capsys.readouterr().out
    assert "from 2030-01-01T00:00:00Z to 2030-01-02T00:00:00Z" in out
    (row,) = csv.DictReader((home / "u.csv").open())
    assert (row["who"], row["slivers"], float(row["core_hours"]), float(row["node_hours"])) == (ALICE, "2", 28.0, 26.0)
    assert f"{ALICE}          2      28.00" in out


def test_a_reversed_period_or_a_garbage_time_is_refused(home: Path, capsys):
    assert main(["--home", str(home), "usage", "--from", "2030-01-02", "--to", "2030-01-01"]) == 2
    assert "ends (2030-01-01T00:00:00Z) before it starts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["--home", str(home), "usage", "--from", "yesterday"])
    assert exited.value.code == 2
    assert "'yesterday' is neither a date" in capsys.readouterr().err

"""`hisparse versions` (release -> version -> saved conformance figures) and the labels of
`hisparse diff` when a side is named by release."""
import json

from engine.cli import versions
from engine.cli.versions import modelled_releases
from tests.helpers import run_cli


def report(tmp_path, name, family, version, release, total, agree, scope, sample=None, sha256=None):
    if sha256 is None:  # the report of the file as it is now
        import engine

        sha256 = engine.load_policy(f"{family}@{version}").sha256
    body = {"policy": {"family": family, "version": version, "upstream": "sglang x", "sha256": sha256},
            "sglang": release,
            "total": total, "counts": {"agree": agree, "out_of_scope": scope, "differ": total - agree - scope},
            "sample": sample, "seconds": 180.0, "groups": []}
    (tmp_path / name).write_text(json.dumps(body))


def _dsa_ref(release):
    return next(ref for ref, _, _ in modelled_releases()[release] if ref.startswith("dsa-backends@"))


def _by_row(rows) -> dict:
    """(release, family) -> row."""
    return {(r["release"], r["version"].rpartition("@")[0] if r["version"] else None): r for r in rows}


def test_every_release_has_a_row_per_family_with_the_version_that_models_it(tmp_path):
    table = modelled_releases()
    found = versions.rows(reports=str(tmp_path))
    releases = list(dict.fromkeys(r["release"] for r in found))  # in order, each once
    assert releases[:len(versions.SGLANG_RELEASES)] == list(versions.SGLANG_RELEASES)
    for release in releases:
        rows = [r for r in found if r["release"] == release]
        refs = [ref for ref, _, _ in table.get(release, [])]
        # one row per family, families in name order; together the versions that model the release
        assert [ref for r in rows for ref in r["versions"]] == sorted(refs, key=lambda ref: ref.rpartition("@")[0])
        for row in rows:
            assert len({ref.rpartition("@")[0] for ref in row["versions"]}) <= 1
            assert row["version"] == (row["versions"][0] if len(row["versions"]) == 1 else None)
            assert row["conformance"] is None  # no saved report in an empty folder
    by_row = _by_row(found)
    assert by_row["0.5.22", "dsa-backends"]["version"] == by_row["0.5.23", "dsa-backends"]["version"]
    assert by_row["0.5.22", "dsv4-backends"]["version"] != by_row["0.5.23", "dsv4-backends"]["version"]
    assert ("0.5.20", "minimax-m3-backends") not in by_row and ("0.5.21", "minimax-m3-backends") in by_row


def test_figures_come_from_the_report_of_that_version_against_that_release(tmp_path):
    ref = _dsa_ref("0.5.23")
    family, number = ref.split("@")
    report(tmp_path, f"{family}-{number}-sglang-0.5.23.json", family, int(number), "0.5.23", 1000, 800, 150,
           sample={"n": 1000, "seed": 5})
    # the same version against another release is that release's figures, not 0.5.23's
    report(tmp_path, "other.json", family, int(number), "0.5.21", 10, 10, 0)
    report(tmp_path, "broken.json", family, int(number), "0.5.22", 10, 10, 0)
    (tmp_path / "broken.json").write_text("{not json")
    rows = versions.rows(reports=str(tmp_path))
    by_row = _by_row(rows)
    conf = by_row["0.5.23", family]["conformance"]
    assert (conf["configs"], conf["agree"], conf["out_of_scope"], conf["differ"]) == (1000, 800, 150, 50)
    assert by_row["0.5.22", family]["conformance"] is None and by_row["0.5.21", family]["conformance"] is None
    assert by_row["0.5.23", "dsv4-backends"]["conformance"] is None  # another family's row: its own reports
    table = versions.markdown_table(rows)
    assert f"| 0.5.23 | `{ref}` | 1,000 (sample, seed 5) | 800 | 150 | 50 |" in table.splitlines()
    assert f"| 0.5.22 | `{ref}` | not run | | | |" in table.splitlines()
    text = versions.text_table([by_row["0.5.23", family], by_row["0.5.22", family]])
    assert "3 min" in text and "not run" in text and "earlier revision" not in text


def test_a_report_of_other_bytes_says_so(tmp_path):
    """A saved report made on an earlier revision of the version's file is shown, and said to be."""
    ref = _dsa_ref("0.5.23")
    family, number = ref.split("@")
    report(tmp_path, "old.json", family, int(number), "0.5.23", 1000, 1000, 0, sha256="0" * 64)
    row = _by_row(versions.rows(reports=str(tmp_path)))["0.5.23", family]
    assert row["conformance"]["current"] is False
    assert f"| 0.5.23 | `{ref}` | 1,000 (an earlier revision of the file) | 1,000 | 0 | 0 |" in \
        versions.markdown_table([row]).splitlines()


def test_hisparse_versions_lists_every_release(capsys):
    code, out, err = run_cli(capsys, "versions", "--format", "json")
    assert code == 0
    releases = [r["release"] for r in json.loads(out)["releases"]]
    assert set(versions.SGLANG_RELEASES) <= set(releases)
    code, out, _ = run_cli(capsys, "versions")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["release", "version"]
    assert len(out.splitlines()) == 1 + len(releases)


def test_diff_labels_sides_by_release(capsys):
    table = modelled_releases()
    old, new = _dsa_ref("0.5.20"), _dsa_ref("0.5.23")
    code, out, _ = run_cli(capsys, "diff", "sglang==0.5.20", "sglang==0.5.23", "--where", "dsa_model=true",
                           "--where", "enable_hisparse=true", "--where", "platform=hip")
    assert code == 1
    assert out.startswith(f"sglang==0.5.20 ({old}) -> sglang==0.5.23 ({new}) where ")
    # one version on both sides: each side names its file too
    code, out, _ = run_cli(capsys, "diff", "sglang==0.5.22", "sglang==0.5.23", "--where", "enable_hisparse=true")
    path = next(p for ref, _, p in table["0.5.23"] if ref == new)
    assert code == 0
    assert out.startswith(f"sglang==0.5.22 ({new}, {path}) -> sglang==0.5.23 ({new}, {path}) where ")
    # by FAMILY@N, as before
    code, out, _ = run_cli(capsys, "diff", old, new, "--where", "enable_hisparse=true", "--where", "platform=hip",
                           "--where", "dsa_model=true")
    assert out.startswith(f"{old} -> {new} where ")

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


def test_every_release_has_a_row_with_the_version_that_models_it(tmp_path):
    table = modelled_releases()
    found = versions.rows(reports=str(tmp_path))
    assert [r["release"] for r in found][:len(versions.SGLANG_RELEASES)] == list(versions.SGLANG_RELEASES)
    for row in found:
        refs = [ref for ref, _, _ in table.get(row["release"], [])]
        assert row["versions"] == refs and row["version"] == (refs[0] if len(refs) == 1 else None)
        assert row["conformance"] is None  # no saved report in an empty folder
    by_release = {r["release"]: r for r in found}
    assert by_release["0.5.22"]["version"] == by_release["0.5.23"]["version"]  # one version, two releases


def test_figures_come_from_the_report_of_that_version_against_that_release(tmp_path):
    ref = modelled_releases()["0.5.23"][0][0]
    family, number = ref.split("@")
    report(tmp_path, f"{family}-{number}-sglang-0.5.23.json", family, int(number), "0.5.23", 1000, 800, 150,
           sample={"n": 1000, "seed": 5})
    # the same version against another release is that release's figures, not 0.5.23's
    report(tmp_path, "other.json", family, int(number), "0.5.21", 10, 10, 0)
    report(tmp_path, "broken.json", family, int(number), "0.5.22", 10, 10, 0)
    (tmp_path / "broken.json").write_text("{not json")
    by_release = {r["release"]: r for r in versions.rows(reports=str(tmp_path))}
    conf = by_release["0.5.23"]["conformance"]
    assert (conf["configs"], conf["agree"], conf["out_of_scope"], conf["differ"]) == (1000, 800, 150, 50)
    assert by_release["0.5.22"]["conformance"] is None and by_release["0.5.21"]["conformance"] is None
    table = versions.markdown_table(list(by_release.values()))
    assert f"| 0.5.23 | `{ref}` | 1,000 (sample, seed 5) | 800 | 150 | 50 |" in table.splitlines()
    assert f"| 0.5.22 | `{ref}` | not run | | | |" in table.splitlines()
    text = versions.text_table(list(by_release.values()))
    assert "3 min" in text and "not run" in text and "earlier revision" not in text


def test_a_report_of_other_bytes_says_so(tmp_path):
    """A saved report made on an earlier revision of the version's file is shown, and said to be."""
    ref = modelled_releases()["0.5.23"][0][0]
    family, number = ref.split("@")
    report(tmp_path, "old.json", family, int(number), "0.5.23", 1000, 1000, 0, sha256="0" * 64)
    row = {r["release"]: r for r in versions.rows(reports=str(tmp_path))}["0.5.23"]
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
    old, new = table["0.5.20"][0][0], table["0.5.23"][0][0]
    code, out, _ = run_cli(capsys, "diff", "sglang==0.5.20", "sglang==0.5.23", "--where", "dsa_model=true",
                           "--where", "enable_hisparse=true", "--where", "platform=hip")
    assert code == 1
    assert out.startswith(f"sglang==0.5.20 ({old}) -> sglang==0.5.23 ({new}) where ")
    # one version on both sides: each side names its file too
    code, out, _ = run_cli(capsys, "diff", "sglang==0.5.22", "sglang==0.5.23", "--where", "enable_hisparse=true")
    path = table["0.5.23"][0][2]
    assert code == 0
    assert out.startswith(f"sglang==0.5.22 ({new}, {path}) -> sglang==0.5.23 ({new}, {path}) where ")
    # by FAMILY@N, as before
    code, out, _ = run_cli(capsys, "diff", old, new, "--where", "enable_hisparse=true", "--where", "platform=hip",
                           "--where", "dsa_model=true")
    assert out.startswith(f"{old} -> {new} where ")

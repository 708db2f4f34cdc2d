"""trace-figures refuses an output path it cannot write into, in one line, before rendering anything."""

from figures.cli import main


def test_an_output_path_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    (tmp_path / "figures.png").write_text("a file")
    code = main(["--results", str(tmp_path / "results"), "--out", str(tmp_path / "figures.png")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [f"trace-figures: error: --out {tmp_path / 'figures.png'}: is a file, "
                                              "not a folder"]


def test_an_output_below_a_file_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    (tmp_path / "blocker").write_text("a file")
    code = main(["--results", str(tmp_path / "results"), "--out", str(tmp_path / "blocker" / "figures")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "not writable" in err and len(err.splitlines()) == 1

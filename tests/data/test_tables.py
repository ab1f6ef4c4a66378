"""Labelled texts from CSV, TSV and JSON-lines files (attnlab.data.readers.tables)."""

import gzip
import json
import warnings

import pytest

from attnlab.data.readers.tables import LabelledTexts, label_names, read_labelled_texts
from attnlab.errors import InputError

from refusals import one_line_refusal


def _write(path, text: str, encoding: str = "utf-8"):
    data = text.encode(encoding)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _jsonl(path, *objects):
    return _write(path, "".join(json.dumps(o) + "\n" for o in objects))


# --- formats ---------------------------------------------------------------------------


def test_csv_reads_texts_labels_and_lines(tmp_path):
    f = _write(tmp_path / "a.csv", "text,label\n a fine film ,pos\nawful,neg\n")
    data = read_labelled_texts(f)
    assert isinstance(data, LabelledTexts)
    assert data.texts == ["a fine film", "awful"]
    assert data.labels == ["pos", "neg"]
    assert data.lines == [2, 3]
    assert data.path == f and data.skipped == 0 and len(data) == 2


def test_tsv_with_other_column_names_and_order(tmp_path):
    f = _write(tmp_path / "a.tsv", "id\tlabel\tsentence\n1\t0\tdull, slow\n2\t1\tgreat\n")
    data = read_labelled_texts(f, text_column="sentence")
    assert data.texts == ["dull, slow", "great"]
    assert data.labels == ["0", "1"]


def test_jsonl_int_and_string_labels_become_strings(tmp_path):
    f = _jsonl(tmp_path / "a.jsonl", {"text": "x", "label": 3}, {"text": "y", "label": "3"}, {"text": "z", "label": 0})
    assert read_labelled_texts(f).labels == ["3", "3", "0"]


def test_jsonl_blank_lines_are_ignored_and_lines_counted(tmp_path):
    f = _write(tmp_path / "a.ndjson", '\n{"text": "x", "label": "a"}\n   \n{"text": "y", "label": "b"}\n')
    data = read_labelled_texts(f)
    assert data.texts == ["x", "y"]
    assert data.lines == [2, 4]


@pytest.mark.parametrize("name", ["a.csv.gz", "a.tsv.gz", "a.jsonl.gz"])
def test_gzipped_files(tmp_path, name):
    if "jsonl" in name:
        text = '{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n'
    else:
        sep = "\t" if ".tsv" in name else ","
        text = f"text{sep}label\ngood{sep}1\nbad{sep}0\n"
    data = read_labelled_texts(_write(tmp_path / name, text))
    assert data.texts == ["good", "bad"]
    assert data.labels == ["1", "0"]


def test_explicit_format_overrides_extension(tmp_path):
    f = _write(tmp_path / "reviews.txt", "text\tlabel\nok\tpos\nno\tneg\n")
    assert read_labelled_texts(f, format="tsv").labels == ["pos", "neg"]


def test_csv_quoted_commas_quotes_and_newlines(tmp_path):
    f = _write(tmp_path / "a.csv", 'text,label\n"slow, but ""fine""",pos\n"two\nlines",neg\nlast,pos\n')
    data = read_labelled_texts(f)
    assert data.texts == ['slow, but "fine"', "two\nlines", "last"]
    assert data.lines == [2, 3, 5]  # a row's line is where it starts


def test_csv_with_bom_and_crlf(tmp_path):
    f = _write(tmp_path / "a.csv", "\ufefftext,label\r\nhi,pos\r\nbye,neg\r\n")
    data = read_labelled_texts(f)
    assert data.texts == ["hi", "bye"]
    assert data.labels == ["pos", "neg"]


def test_csv_blank_rows_are_ignored(tmp_path):
    f = _write(tmp_path / "a.csv", "text,label\nhi,pos\n\n,\nbye,neg\n")
    data = read_labelled_texts(f)
    assert data.texts == ["hi", "bye"]
    assert data.skipped == 0


# --- label_names -----------------------------------------------------------------------


def test_label_names_integers_sort_numerically():
    assert label_names(["10", "2", "1", "2", "0"]) == ["0", "1", "2", "10"]
    assert label_names(["1", "-1"]) == ["-1", "1"]


def test_label_names_strings_sort_as_strings():
    assert label_names(["pos", "neg", "10", "2"]) == ["10", "2", "neg", "pos"]


def test_label_names_one_class_is_an_error(tmp_path):
    with pytest.raises(InputError, match=r"at least 2 classes; .*a\.csv has only 'pos'"):
        label_names(["pos", "pos"], source=tmp_path / "a.csv")
    f = _write(tmp_path / "b.csv", "text,label\nx,pos\ny,pos\n")
    with pytest.raises(InputError, match=r"b\.csv has only 'pos'"):
        read_labelled_texts(f).label_names()


def test_labels_one_and_one_point_zero_warn_naming_both_and_the_file(tmp_path):
    f = _write(tmp_path / "mixed.csv", "text,label\nx,1\ny,1.0\nz,0\n")
    with pytest.warns(UserWarning) as record:
        names = read_labelled_texts(f).label_names()
    assert names == ["0", "1", "1.0"]  # still three classes: the warning says so, nothing is merged
    assert len(record) == 1
    message = str(record[0].message)
    assert "'1' and '1.0'" in message and str(f) in message and "'0'" not in message


@pytest.mark.parametrize("labels, same", [(["01", "1", "2"], "'01' and '1'"), (["1e0", "1", "3"], "'1' and '1e0'"),
                                          (["-0", "0", "5"], "'-0' and '0'"), ([".5", "0.50", "1"], "'.5' and '0.50'")])
def test_every_spelling_of_one_number_warns(labels, same):
    with pytest.warns(UserWarning, match=f"labels {same} are the same number written differently"):
        label_names(labels)


def test_two_numbers_spelled_twice_are_named_in_one_warning():
    with pytest.warns(UserWarning) as record:
        label_names(["1", "1.0", "2", "2.0"])
    assert len(record) == 1 and "'1' and '1.0'; '2' and '2.0'" in str(record[0].message)


@pytest.mark.parametrize("labels", [["1", "2", "10"], ["0.5", "1.5", "1"], ["1", "one", "1a"], ["nan", "NaN", "x"],
                                    ["inf", "Infinity", "x"], ["1_0", "10", "x"]])
def test_distinct_numbers_and_words_do_not_warn(labels):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(label_names(labels)) == 3


# --- errors ----------------------------------------------------------------------------


def test_unknown_extension_names_accepted_ones(tmp_path):
    f = _write(tmp_path / "data.xlsx", "text,label\n")
    with pytest.raises(InputError, match=r"data\.xlsx.*\.csv, \.tsv, \.jsonl, \.ndjson.*set format"):
        read_labelled_texts(f)


def test_unknown_format_value(tmp_path):
    with pytest.raises(InputError, match="format must be .* got 'xls'"):
        read_labelled_texts(tmp_path / "a.csv", format="xls")


def test_missing_column_names_the_columns(tmp_path):
    f = _write(tmp_path / "a.csv", "Text,label\nhi,pos\n")
    with pytest.raises(
        InputError, match=r"a\.csv: .*no column 'text' \(text_column, data.text_column in a recipe\); did you mean Text\? \(columns: Text, label\)"
    ):
        read_labelled_texts(f)
    f = _write(tmp_path / "b.csv", "review,sentiment\nhi,pos\n")
    with pytest.raises(InputError, match=r"b\.csv: .*no column 'text'.*columns: review, sentiment"):
        read_labelled_texts(f)


def test_jsonl_missing_key_everywhere_names_the_keys(tmp_path):
    f = _jsonl(tmp_path / "a.jsonl", {"sentence": "x", "label": 1})
    with pytest.raises(InputError, match=r"a\.jsonl: no object has .*'text'.*columns: label, sentence"):
        read_labelled_texts(f)


def test_missing_text_names_file_and_line(tmp_path):
    f = _write(tmp_path / "a.csv", "text,label\nhi,pos\n   ,neg\n")
    with pytest.raises(
        InputError, match=r"a\.csv: line 3: the text \(column 'text'\) is empty.*data\.skip_bad_rows=true"
    ):
        read_labelled_texts(f)


def test_jsonl_missing_label_names_line(tmp_path):
    f = _jsonl(tmp_path / "a.jsonl", {"text": "x", "label": "a"}, {"text": "y"}, {"text": "z", "label": None})
    with pytest.raises(InputError, match=r"a\.jsonl: line 2: the label \(column 'label'\) is missing.*skip_bad_rows"):
        read_labelled_texts(f)


def test_wrong_number_of_fields_is_a_bad_row(tmp_path):
    f = _write(tmp_path / "a.csv", "text,label\nslow, but fine,pos\n")
    with pytest.raises(InputError, match=r"a\.csv: line 2: has 3 fields but the header has 2 .*double quotes"):
        read_labelled_texts(f)


def test_skip_bad_rows_counts_them(tmp_path):
    f = _write(tmp_path / "a.csv", "text,label\nhi,pos\n,neg\nno label,\nslow, but fine,pos\nbye,neg\n")
    data = read_labelled_texts(f, skip_bad_rows=True)
    assert data.texts == ["hi", "bye"]
    assert data.lines == [2, 6]
    assert data.skipped == 3


def test_skip_bad_rows_jsonl(tmp_path):
    f = _jsonl(tmp_path / "a.jsonl", {"text": "x", "label": 1}, {"text": "", "label": 0}, {"label": 0})
    data = read_labelled_texts(f, skip_bad_rows=True)
    assert (data.texts, data.skipped) == (["x"], 2)


def test_all_rows_bad_is_no_rows(tmp_path):
    f = _write(tmp_path / "a.csv", "text,label\n,pos\nx,\n")
    with pytest.raises(InputError, match=r"a\.csv has no rows left: all 2"):
        read_labelled_texts(f, skip_bad_rows=True)


@pytest.mark.parametrize("text", ["", "text,label\n", "\n\n"])
def test_empty_or_header_only_file_has_no_rows(tmp_path, text):
    with pytest.raises(InputError, match=r"a\.csv has no rows"):
        read_labelled_texts(_write(tmp_path / "a.csv", text))


def test_empty_jsonl_has_no_rows(tmp_path):
    with pytest.raises(InputError, match=r"a\.jsonl has no rows"):
        read_labelled_texts(_write(tmp_path / "a.jsonl", "\n"))


def test_bad_json_line(tmp_path):
    f = _write(tmp_path / "a.jsonl", '{"text": "x", "label": 1}\n{"text": "y", label: 0}\n')
    with pytest.raises(InputError, match=r"a\.jsonl: line 2 is not valid JSON"):
        read_labelled_texts(f)


def test_json_line_that_is_not_an_object(tmp_path):
    f = _write(tmp_path / "a.jsonl", '{"text": "x", "label": 1}\n["y", 0]\n')
    with pytest.raises(InputError, match=r"a\.jsonl: line 2 is a JSON array, not an object"):
        read_labelled_texts(f)


@pytest.mark.parametrize(("label", "kind"), [(True, "boolean"), (1.5, "number"), ([1], "array")])
def test_jsonl_label_of_wrong_type(tmp_path, label, kind):
    f = _jsonl(tmp_path / "a.jsonl", {"text": "x", "label": 1}, {"text": "y", "label": label})
    with pytest.raises(InputError, match=rf"a\.jsonl: line 2: the label .* string or an integer; got .*, a {kind}"):
        read_labelled_texts(f)


def test_jsonl_text_must_be_a_string(tmp_path):
    f = _jsonl(tmp_path / "a.jsonl", {"text": 42, "label": 1})
    with pytest.raises(InputError, match=r"line 1: the text \('text'\) must be a string; got 42, a number"):
        read_labelled_texts(f)


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    f = tmp_path / "a.csv"
    f.write_bytes("text,label\nok,pos\nclich\xe9,neg\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"a\.csv: line 3 is not valid utf-8"):
        read_labelled_texts(f)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        read_labelled_texts(tmp_path / "nope.csv")


def test_same_text_and_label_column(tmp_path):
    with pytest.raises(InputError, match="must be different columns"):
        read_labelled_texts(tmp_path / "a.csv", text_column="x", label_column="x")


# ---------------------------------------------------------------------------- JSON nested too deep


def test_a_json_lines_data_set_nested_too_deep_exits_2_in_one_line(tmp_path, capsys):
    data = tmp_path / "reviews.jsonl"
    rows = [json.dumps({"text": f"a fine film {i}", "label": "pos" if i % 2 else "neg"}) for i in range(20)]
    rows[3] = '{"text": ' + "[" * 5000 + "]" * 5000 + ', "label": "pos"}'
    data.write_text("\n".join(rows) + "\n")
    one_line_refusal(capsys, ["train", "text-classification", f"data.train={data}", "--run-dir", str(tmp_path / "r")],
                     "reviews.jsonl: line 4 nests its JSON 5001 levels deep")

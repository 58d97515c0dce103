"""Issue 16 case 4: a manifest line that is not UTF-8 is an error naming the file and the line."""

import pytest

from jaxcap.data.manifest import ManifestError, read_manifest


def test_non_utf8_manifest_line_names_file_and_line(tmp_path):
  path = tmp_path / "manifest.jsonl"
  path.write_bytes(b'{"id": "a", "image": "a.jpg"}\n{"id": "caf\xe9", "image": "b.jpg"}\n')
  with pytest.raises(ManifestError) as e:
    read_manifest(path)
  message = str(e.value)
  assert message.startswith(f"{path}:2 is not UTF-8") and "0xe9 at column 12" in message, message  # file, line, byte
  assert "re-encode the file as UTF-8" in message and "iconv" in message and "fix that line" in message  # the fixes
  path.write_bytes('\ufeff{"id": "a", "image": "a.jpg"}\n'.encode())  # a byte-order mark is not an error
  assert [r.id for r in read_manifest(path).records] == ["a"]

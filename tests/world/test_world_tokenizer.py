from tokenizers import Tokenizer

from jaxcap.world.tokenizer import QWEN2_5_VL_SPECIAL_TOKENS, train_world_tokenizer


def test_world_tokenizer_round_trips_and_keeps_qwen_special_tokens(tmp_path):
  path = train_world_tokenizer(tmp_path, vocab_size=600)
  tok = Tokenizer.from_file(str(path))
  for token in QWEN2_5_VL_SPECIAL_TOKENS:
    assert tok.token_to_id(token) is not None, token
  text = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"
    'A large red circle is in the top left, labelled "EXIT".<|im_end|>'
  )
  enc = tok.encode(text)
  assert tok.decode(enc.ids, skip_special_tokens=False) == text
  assert enc.tokens.count("<|image_pad|>") == 1
  assert len(tok.encode("A large red circle is in the top left.").ids) < 15  # world words are merged

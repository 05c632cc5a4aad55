"""Chat templates render exactly as transformers' `apply_chat_template(tokenize=False)` does.

Each family's template (ChatML as Qwen2.5 ships it, Qwen3's thinking variant, Gemma 3's turns)
is saved into a tokenizer folder by transformers itself; jaxpod reads the folder and renders
the same conversations; the strings must be equal.
"""
import json
import pathlib

import pytest

from jaxpod.data.chat import (ChatTemplateError, load_chat_template, load_special_tokens, render_chat,
                              split_prompt_answer)

TEMPLATES = pathlib.Path(__file__).parent / "chat_templates"
SPECIAL = {"qwen2_5": dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"),
           "qwen3": dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"),
           "gemma3": dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")}
FILES = {"qwen2_5": "chatml_qwen2_5.jinja", "qwen3": "qwen3_thinking.jinja", "gemma3": "gemma3.jinja"}

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers <fast> & exact",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is 2+3?"}],
    "system_user": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi <b>there</b>"}],
    "multi_turn": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"},
                   {"role": "user", "content": " and 4+4? "}],
}
QWEN_TOOL_CALL = [{"role": "user", "content": "add 2 and 3"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
                  {"role": "tool", "content": "5"}, {"role": "tool", "content": "ok"}]
QWEN3_REASONING = [{"role": "user", "content": "2+3?"},
                   {"role": "assistant", "content": "5", "reasoning_content": "two plus three"},
                   {"role": "user", "content": "and 1+1?"},
                   {"role": "assistant", "content": "<think>\none and one\n</think>\n\n2"}]


def _tokenizer_folder(tmp_path_factory, family):
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.BPE(unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  specials = {k: v for k, v in SPECIAL[family].items() if v is not None}
  hf = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=(TEMPLATES / FILES[family]).read_text(), **specials)
  folder = tmp_path_factory.mktemp(family)
  hf.save_pretrained(folder)
  return folder


@pytest.fixture(scope="module", params=sorted(FILES))
def family_folder(request, tmp_path_factory):
  return request.param, _tokenizer_folder(tmp_path_factory, request.param)


def _hf_render(folder, messages, **kwargs):
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(folder, local_files_only=True).apply_chat_template(
      messages, tokenize=False, **kwargs)


def _ours(folder, messages, **kwargs):
  return render_chat(load_chat_template(str(folder)), messages, special_tokens=load_special_tokens(str(folder)),
                     **kwargs)


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_equals_transformers(family_folder, conversation, add_generation_prompt):
  family, folder = family_folder
  messages = CONVERSATIONS[conversation]
  expected = _hf_render(folder, messages, add_generation_prompt=add_generation_prompt)
  assert _ours(folder, messages, add_generation_prompt=add_generation_prompt) == expected


def test_qwen_tool_calls_and_tool_schemas_render_as_transformers(tmp_path_factory):
  folder = _tokenizer_folder(tmp_path_factory, "qwen2_5")
  expected = _hf_render(folder, QWEN_TOOL_CALL, tools=TOOLS, add_generation_prompt=True)
  assert "<fast> & exact" in expected  # tojson must not escape HTML
  assert _ours(folder, QWEN_TOOL_CALL, tools=TOOLS, add_generation_prompt=True) == expected


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_reasoning_and_template_variables_render_as_transformers(tmp_path_factory, enable_thinking):
  folder = _tokenizer_folder(tmp_path_factory, "qwen3")
  for messages in (QWEN3_REASONING, QWEN3_REASONING[:3]):
    expected = _hf_render(folder, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
    assert _ours(folder, messages, add_generation_prompt=True, enable_thinking=enable_thinking) == expected


def test_template_in_tokenizer_config_is_read_like_transformers(tmp_path):
  template = (TEMPLATES / FILES["gemma3"]).read_text()
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"chat_template": [{"name": "default", "template": template}, {"name": "tool_use", "template": "x"}],
       "bos_token": {"content": "<bos>", "special": True}, "eos_token": "<eos>"}))
  assert load_chat_template(str(tmp_path)) == template
  assert load_special_tokens(str(tmp_path)) == {"bos_token": "<bos>", "eos_token": "<eos>"}


def test_folder_without_template_has_none(tmp_path):
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
  assert load_chat_template(str(tmp_path)) is None
  assert load_chat_template(str(tmp_path / "absent")) is None


def test_template_refusal_is_one_line_naming_the_input(tmp_path_factory):
  folder = _tokenizer_folder(tmp_path_factory, "gemma3")
  bad = [{"role": "assistant", "content": "I speak first"}]
  with pytest.raises(ChatTemplateError, match=r"^prompts.jsonl:7: the chat template refused .*alternate") as e:
    _ours(folder, bad, add_generation_prompt=True, where="prompts.jsonl:7")
  assert "\n" not in str(e.value)


def test_template_cannot_reach_python_internals():
  with pytest.raises(Exception, match="unsafe|not safely|access"):
    render_chat("{{ messages.__class__.__mro__ }}", [{"role": "user", "content": "x"}], add_generation_prompt=False)


def test_messages_must_be_a_list_of_role_dicts():
  with pytest.raises(ChatTemplateError, match="pairs.jsonl:3: message 1 is not a dict with a 'role'"):
    render_chat("{{ messages }}", [{"role": "user", "content": "a"}, "b"], add_generation_prompt=False,
                where="pairs.jsonl:3")
  with pytest.raises(ChatTemplateError, match="expected a list of messages, got str"):
    render_chat("{{ messages }}", "hello", add_generation_prompt=False)


def test_answer_is_what_follows_the_rendered_prompt():
  template = (TEMPLATES / FILES["qwen2_5"]).read_text()
  prompt, answer = split_prompt_answer(template, [{"role": "user", "content": "2+3?"}],
                                       [{"role": "assistant", "content": "5"}])
  assert prompt.endswith("<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n")
  assert answer == "5<|im_end|>\n"


def test_prompt_that_renders_differently_before_an_answer_is_refused():
  # Renders the last user turn differently when it is not the last message: no answer mask can be right.
  template = ("{% for m in messages %}{% if loop.last and m.role == 'user' %}[LAST]{% endif %}{{ m.content }}"
              "{% endfor %}{% if add_generation_prompt %}>{% endif %}")
  with pytest.raises(ChatTemplateError, match="row 4: the chat template renders the prompt differently"):
    split_prompt_answer(template, [{"role": "user", "content": "q"}], [{"role": "assistant", "content": "a"}],
                        where="row 4")

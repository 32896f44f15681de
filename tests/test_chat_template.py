"""Chat templates against transformers' `apply_chat_template(tokenize=False)`, and the sandbox."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import jinja2.exceptions
import pytest

from strata.gguf.reader import GGUFFile
from strata.prompt.chat_template import ChatTemplate, TemplateError
from strata.prompt.tokenizer import Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": None,  # as OpenAI-style clients send it; dropped before rendering
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
        ],
    },
    {"role": "tool", "content": '{"temp_c": 21, "sky": "☀️"}'},
    {"role": "assistant", "content": "It is 21 °C and sunny."},
    {"role": "user", "content": "Thanks! <|im_end|> is not special here."},
]
CASES = {
    "system_user": (
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi 你好"}],
        None,
    ),
    "user_only": ([{"role": "user", "content": "Write a haiku.\n\nAbout tabs\tand spaces."}], None),
    "multi_turn": (
        [
            {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "And 2+2?"},
        ],
        None,
    ),
    "tools_only": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL]),
    "tool_call_and_result": (TOOL_CONVERSATION, [WEATHER_TOOL]),
}


@pytest.fixture(scope="module")
def qwen(qwen_path: Path) -> tuple[ChatTemplate, Tokenizer]:
    meta = GGUFFile(qwen_path).metadata
    tokenizer = Tokenizer.from_gguf(meta)
    template = ChatTemplate.from_gguf(meta, tokenizer)
    assert template is not None
    return template, tokenizer


@pytest.fixture(scope="module")
def qwen_reference(qwen_path: Path):
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(qwen_path.parent), gguf_file=qwen_path.name)


@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_qwen_matches_transformers(qwen, qwen_reference, case: str, add_generation_prompt: bool) -> None:
    template, _ = qwen
    messages, tools = CASES[case]
    expected = qwen_reference.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt) == expected


def test_qwen_render_shape(qwen) -> None:
    template, tokenizer = qwen
    assert (template.bos_token, template.eos_token) == ("<|endoftext|>", "<|im_end|>")
    text = template.render(TOOL_CONVERSATION, tools=[WEATHER_TOOL])
    assert '{"name": "get_weather", "arguments": {"city": "Zürich"}}' in text  # tojson keeps non-ASCII
    assert "<tool_response>\n" in text and "None" not in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(text)
    assert ids.count(151644) == text.count("<|im_start|>")
    # The caller's messages are not changed by rendering.
    assert TOOL_CONVERSATION[2]["content"] is None


def test_template_kwargs_and_special_tokens() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}{{ extra }}{{ eos_token }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    messages = [{"role": "user", "content": "hi"}]
    assert template.render(messages, extra="!") == "<s>[user]hi>!</s>"
    assert template.render(messages, add_generation_prompt=False, eos_token="") == "<s>[user]hi"


def test_helpers() -> None:
    source = (
        "{{ messages[0] | tojson }}|{{ [1, 2] | tojson(indent=2) }}|{{ strftime_now('%Y') }}|"
        "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}|"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    )
    out = ChatTemplate(source).render([{"role": "user", "content": "é <b>&</b>"}])
    year = datetime.now().strftime("%Y")
    assert out == '{"role": "user", "content": "é <b>&</b>"}|[\n  1,\n  2\n]|' + year + "|01|1"


def test_raise_exception_is_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('need a user turn') }}{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TemplateError, match="need a user turn"):
        template.render([{"role": "system", "content": "x"}])
    assert issubclass(TemplateError, ValueError)


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{% set ns = namespace(_x=1) %}",
        "{{ messages.append(1) }}",
    ],
)
def test_sandbox_refuses_unsafe_access(source: str) -> None:
    with pytest.raises(TemplateError) as info:
        ChatTemplate(source).render([{"role": "user", "content": "x"}])
    assert isinstance(info.value.__cause__, jinja2.exceptions.SecurityError)


def test_unsafe_attribute_alone_renders_nothing() -> None:
    assert ChatTemplate("[{{ ''.__class__ }}]").render([]) == "[]"


def test_syntax_error_is_template_error() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% if %}")


def test_gemma_gguf_has_no_template(gemma_path: Path) -> None:
    meta = GGUFFile(gemma_path).metadata
    assert "tokenizer.chat_template" not in meta
    assert ChatTemplate.from_gguf(meta, Tokenizer.from_gguf(meta)) is None  # callers pick a builtin


def test_chatml_builtin() -> None:
    template = ChatTemplate.builtin("chatml", eos_token="<|im_end|>")
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(chat) == text
    assert template.render([{"role": "user", "content": "U"}], add_generation_prompt=False) == (
        "<|im_start|>user\nU<|im_end|>\n"
    )
    rp = template.render_prompt(TOOL_CONVERSATION, tools=[WEATHER_TOOL])
    assert rp.text == template.render(TOOL_CONVERSATION, tools=[WEATHER_TOOL])
    assert rp.text.startswith("<|im_start|>system\nYou are a weather bot.\n\n# Tools\n")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>' in rp.text
    assert "\n<tool_response>\n" + TOOL_CONVERSATION[3]["content"] in rp.text
    assert [rp.text[a:b] for a, b in rp.plain][-1] == TOOL_CONVERSATION[-1]["content"]
    string_args = [
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}
    ]
    assert template.render(string_args, add_generation_prompt=False) == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n'
    )
    with pytest.raises(TemplateError, match="no built-in chat template named 'llama'.*chatml"):
        ChatTemplate.builtin("llama")


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ({"role": "user"}, "messages must be a list"),
        (["hi"], "message 0 must be an object"),
        (
            [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}],
            "message 1 has unknown role 'bot'",
        ),
        ([{"role": "user", "content": 5}], r"message 0 \(user\): content must be a string or a list of text"),
        ([{"role": "tool", "content": {"a": 1}}], r"message 0 \(tool\): content must be a string"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "content part 0 has type 'image",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "content part 0: text must be a string"),
        ([{"role": "user"}], r"message 0 \(user\) has no content"),
        ([{"role": "user", "content": None}], r"message 0 \(user\) has no content"),
        ([{"role": "assistant"}], r"message 0 \(assistant\) has no content"),
        ([{"role": "user", "content": "a", "tool_calls": []}], "only assistant messages have tool_calls"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}],
            "tool call 0: arg",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}],
            "tool call 0: the function name",
        ),
        ([{"role": "user", "content": "a", "name": 3}], "name must be a string"),
    ],
)
def test_bad_chats_name_the_message(qwen, messages, match: str) -> None:
    template, _ = qwen
    for render in (template.render, template.render_prompt):
        with pytest.raises(TemplateError, match=match):
            render(messages)


def test_bad_tools_and_template_failures(qwen) -> None:
    with pytest.raises(TemplateError, match="tool 1 must be an object"):
        qwen[0].render_prompt([{"role": "user", "content": "a"}], tools=[WEATHER_TOOL, "x"])
    alternate = ChatTemplate(
        "{% for m in messages %}{% if (m.role == 'user') != loop.index0 is even %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    with pytest.raises(TemplateError, match="refused the conversation at message 2: roles must alternate"):
        alternate.render_prompt(chat)
    with pytest.raises(TemplateError, match="failed at message 0: can only concatenate str"):
        ChatTemplate("{% for m in messages %}{{ m.content + loop.index0 }}{% endfor %}").render(chat)


def test_developer_is_system_and_parts_are_joined(qwen) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    template, _ = qwen
    assert template.render([{"role": "developer", "content": parts}]) == template.render(
        [{"role": "system", "content": "a\nb"}]
    )

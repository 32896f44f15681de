"""Chat templates that strata ships, for models whose GGUF file has none (`ChatTemplate.builtin`).

"chatml": ChatML (`<|im_start|>role\\n...<|im_end|>\\n`), with tools the way Qwen2.5's template offers
them: the schemas as JSON lines inside <tools></tools> in the system turn, calls as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>` (string arguments copied as they are, objects as
JSON), results inside <tool_response></tool_response> in a user turn. Unlike Qwen's, it adds no default
system prompt.

"chatml-think": the same with a Qwen3-style think block: the generation prompt opens `<think>` (or,
with `enable_thinking=false`, writes an empty block so the model answers at once). For models that
reason but whose file has no template, and for testing reasoning with any ChatML model.
"""

from __future__ import annotations

# A raw string: the backslash escapes are Jinja's.
CHATML = r"""{%- set system = messages[0].content if messages and messages[0].role == 'system' else none %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if system is not none %}
        {{- system + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif system is not none %}
    {{- '<|im_start|>system\n' + system + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if not loop.first or message.content %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

_THINK_PROMPT = r"""{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and not enable_thinking %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
"""
_PLAIN_PROMPT = CHATML[CHATML.rindex("{%- if add_generation_prompt %}") :]
CHATML_THINK = CHATML.replace(_PLAIN_PROMPT, _THINK_PROMPT)

BUILTIN_TEMPLATES: dict[str, str] = {"chatml": CHATML, "chatml-think": CHATML_THINK}

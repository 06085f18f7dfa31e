"""Turn a client's prompt (plain text, or chat messages through the model's chat template) into token ids."""

from __future__ import annotations

import json

from ..errors import InvalidRequest


def _json(raw: str, name: str, what: str):
    """raw parsed as JSON; InvalidRequest naming the input (`name must be <what>`) where it is not."""
    try:
        return json.loads(raw)
    except ValueError as e:  # json.JSONDecodeError, and an integer too long to convert
        raise InvalidRequest(f"{name} must be {what}: {e}") from None
    except RecursionError:
        raise InvalidRequest(f"{name} is nested too deeply to parse") from None


def parse_messages(raw: str) -> list[dict]:
    """`messages` input: a JSON list of {"role": str, "content": str}."""
    messages = _json(raw, "messages", "a JSON list of {role, content} objects")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise InvalidRequest('messages must be a non-empty JSON list of {"role": str, "content": str} objects')
    return messages


# apply_chat_template's own arguments: not template variables a client may set
_RESERVED = frozenset(
    "conversation messages add_generation_prompt tokenize return_dict tools documents chat_template "
    "continue_final_message return_tensors".split()
)


def parse_template_kwargs(raw: str) -> dict:
    """`chat_template_kwargs` input (vLLM's key): a JSON object of extra variables for the chat template, e.g.
    {"enable_thinking": false} for the thinking models' templates."""
    kwargs = _json(raw, "chat_template_kwargs", "a JSON object")
    if not isinstance(kwargs, dict):
        raise InvalidRequest("chat_template_kwargs must be a JSON object of template variables")
    reserved = sorted(_RESERVED & set(kwargs))
    if reserved:
        raise InvalidRequest(f"chat_template_kwargs may not set {', '.join(reserved)} (arguments of the template call)")
    return kwargs


def prompt_ids(
    tokenizer, text: str | None, messages: list[dict] | None, chat: bool, template_kwargs: dict | None = None
) -> list[int]:
    """Plain text is tokenized as is (with the tokenizer's own special tokens, e.g. BOS); with `chat` or
    `messages`, the chat template renders the conversation (with template_kwargs as extra variables) and appends
    the assistant turn's opening."""
    if messages is None and chat:
        messages = [{"role": "user", "content": text or ""}]
    if template_kwargs and messages is None:
        raise InvalidRequest("chat_template_kwargs applies to chat prompts: set apply_chat_template or send messages")
    if messages is not None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise InvalidRequest("this model has no chat template; send plain text_input without apply_chat_template")
        try:
            rendered = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
            )
        except Exception as e:  # noqa: BLE001 - jinja2's TemplateError (the template's own raise_exception), ...
            raise InvalidRequest(f"messages: the model's chat template refused them: {e}") from None
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    else:
        if not text:
            raise InvalidRequest("text_input is empty: give a prompt (or a messages list)")
        ids = tokenizer(text)["input_ids"]
    if not ids:
        raise InvalidRequest("the prompt tokenizes to zero tokens")
    return list(ids)

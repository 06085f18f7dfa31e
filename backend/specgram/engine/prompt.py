"""Turn a client's prompt (plain text, or chat messages through the model's chat template) into token ids."""

from __future__ import annotations

import json

from ..errors import InvalidRequest


def parse_messages(raw: str) -> list[dict]:
    """`messages` input: a JSON list of {"role": str, "content": str}."""
    try:
        messages = json.loads(raw)
    except ValueError as e:  # json.JSONDecodeError, and an integer too long to convert
        raise InvalidRequest(f"messages must be a JSON list of {{role, content}} objects: {e}") from None
    except RecursionError:
        raise InvalidRequest("messages is nested too deeply to parse") from None
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


def prompt_ids(tokenizer, text: str | None, messages: list[dict] | None, chat: bool) -> list[int]:
    """Plain text is tokenized as is (with the tokenizer's own special tokens, e.g. BOS); with `chat` or
    `messages`, the chat template renders the conversation and appends the assistant turn's opening."""
    if messages is None and chat:
        messages = [{"role": "user", "content": text or ""}]
    if messages is not None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise InvalidRequest("this model has no chat template; send plain text_input without apply_chat_template")
        try:
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
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

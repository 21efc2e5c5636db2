"""Chat-bot messenger (Telegram Bot API): POST {base}/bot<token>/sendMessage."""
from __future__ import annotations

from notify.channels.base import Channel, Context, DeliveryError, Field, Message


class TelegramChannel(Channel):
    type = "telegram"
    label = "Telegram bot"
    fields = (
        Field("bot_token", "Bot token", secret=True, required=True),
        Field("chat_id", "Chat ID", required=True),
    )

    async def send(self, msg: Message, config: dict, ctx: Context) -> str:
        base = ctx.settings.notify_telegram_base.rstrip("/")
        reply = await ctx.http.send("POST", f"{base}/bot{config['bot_token']}/sendMessage",
                                    json_body={"chat_id": config["chat_id"], "text": msg.text()[:4096],
                                               "disable_web_page_preview": True})
        data = reply.json() or {}
        if reply.status == 200 and data.get("ok") is True:
            return f"message_id {(data.get('result') or {}).get('message_id', '')}"
        # Never echo the URL: it holds the bot token.
        raise DeliveryError(f"Telegram answered HTTP {reply.status}: "
                            f"{data.get('description') or reply.snippet(200)}")

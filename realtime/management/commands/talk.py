"""``manage.py talk FILE``: speak a recording to a running server, follow the conversation to its
end, print each turn and each reply, and keep the last reply's audio."""

import asyncio
import wave

from django.core.management.base import BaseCommand, CommandError

from realtime.audio import PCM_RATE
from realtime.client import talk


class Command(BaseCommand):
    help = ("Stream an audio file (WAV, FLAC, MP3) to a running server as a live microphone would, "
            "print every user turn and every reply until the last turn is answered, and write "
            "the last reply to a WAV file.")

    def add_arguments(self, parser):
        parser.add_argument("audio", help="a WAV, FLAC or MP3 file")
        parser.add_argument("--url", default="ws://127.0.0.1:8000/v1",
                            help="the server's base URL; /realtime is appended (default: %(default)s)")
        parser.add_argument("--api-key", default="local")
        parser.add_argument("--out", default="reply.wav", help="where to write the last reply (default: %(default)s)")
        parser.add_argument("--voice", help="an OpenAI or Kokoro voice name")
        parser.add_argument("--instructions", help="the system instructions of the session")
        parser.add_argument("--turn-detection", choices=["semantic_vad", "server_vad"], default="semantic_vad",
                            help="how the server decides that you have finished (default: %(default)s)")
        parser.add_argument("--fast", action="store_true", help="send the recording as fast as possible")

    def handle(self, *args, **options):
        session = {"type": "realtime",
                   "audio": {"input": {"turn_detection": {"type": options["turn_detection"]}}}}
        if options["voice"]:
            session["audio"]["output"] = {"voice": options["voice"]}
        if options["instructions"]:
            session["instructions"] = options["instructions"]
        try:
            result = asyncio.run(talk(options["url"], options["audio"], api_key=options["api_key"],
                                      session=session, realtime_factor=0 if options["fast"] else 1.0,
                                      on_event=self._show))
        except OSError as exc:
            raise CommandError(f"Cannot reach the server at {options['url']}: {exc}") from exc
        with wave.open(options["out"], "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(PCM_RATE)
            out.writeframes(result.audio)
        seconds = len(result.audio) / 2 / PCM_RATE
        self.stdout.write(f"reply:     {seconds:.1f} s of audio in {options['out']} (status {result.status})")

    def _show(self, event):
        """Each turn as it is transcribed, each reply as it ends."""
        if event.type == "conversation.item.input_audio_transcription.completed":
            self.stdout.write(f"you:       {event.transcript}")
        elif event.type == "response.done":
            response = event.response
            text = "".join(part.transcript or "" for item in response.output if item.type == "message"
                           for part in (item.content or []))
            if response.status == "completed":
                self.stdout.write(f"assistant: {text}")
            else:
                reason = getattr(response.status_details, "reason", None) if response.status_details else None
                self.stdout.write(f"assistant: ({response.status}{', ' + reason if reason else ''}) {text}")

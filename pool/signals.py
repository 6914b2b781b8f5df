"""What happens to session history when a user is deleted (``HISTORY_ON_USER_DELETE``).

A user's API keys go with the user (``APIKey.user`` cascades), and their sessions would then keep
their words and recordings with no owner. Before the user is deleted, the sessions of their keys
lose their content: "anonymise" (the default) empties the conversation's words and the
recordings and keeps the rest (times, counts, turn timings) for the operators' statistics;
"delete" deletes the sessions with everything they hold.
"""

from django.conf import settings
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from pool.conf import get_config
from pool.models import ConversationItem, Session


@receiver(pre_delete, sender=settings.AUTH_USER_MODEL)
def forget_the_users_sessions(sender, instance, **kwargs):
    sessions = Session.objects.filter(api_key__user=instance)
    for session in sessions.exclude(user_audio="", assistant_audio=""):
        for recording in (session.user_audio, session.assistant_audio):
            if recording:
                recording.storage.delete(recording.name)
    if get_config()["HISTORY_ON_USER_DELETE"] == "delete":
        sessions.delete()
        return
    ConversationItem.objects.filter(session__in=sessions).update(text="", data={})
    sessions.update(user_audio="", assistant_audio="", last_error="")

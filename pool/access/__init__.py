"""Access: who may open a session, and on which unit (credentials, keys and client secrets, the
client's address, origins, the connect rate, cluster-wide admission and reservations), with the
database calls a connect makes on threads of their own.

It may import Django's ORM (``pool.models``) and the pipeline's registry; nothing of ``realtime``.
"""

"""The worker app's delivery configuration, as imported (services/worker/app.py on top of
exportcore.broker.make_celery): acknowledged late, rejected back to the queue when a child
dies, one message prefetched per child, on the app and on both export tasks
(docs/architecture.md, "Queues and shutdown"). tests/integration/test_worker_prefork.py
asserts the same on a running prefork worker. JSON is the only content type anything of the
app sends or accepts (tasks, results, events, remote control);
tests/integration/test_worker_messages.py shows a running worker refusing a pickle."""

from __future__ import annotations

from services.worker import app as worker


def test_the_worker_acknowledges_late_rejects_on_loss_and_prefetches_one() -> None:
    conf = worker.app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    for task in (worker.run_export, worker.run_exports):
        assert task.acks_late is True, task.name
        assert task.reject_on_worker_lost is True, task.name


def test_json_is_the_only_content_type_sent_or_accepted() -> None:
    conf = worker.app.conf
    assert conf.accept_content == ["json"]
    assert conf.result_accept_content == ["json"]
    assert conf.task_serializer == conf.result_serializer == conf.event_serializer == "json"
    mailbox = worker.app.control.mailbox  # remote control (inspect, the workers page)
    assert list(mailbox.accept) == ["json"] and mailbox.serializer == "json"

"""``inturn queue payload`` and ``inturn queue erase``: the privacy role's commands (viewing a
payload, data-subject erasure by item or by patient identifier), part of the ``queue`` group
(:mod:`inturn.worker.cli.queue` adds them). Their rules are
:mod:`inturn.worker.operations.privacy`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable

import click

from inturn.worker.cli.db import act, run_db, with_payloads
from inturn.worker.cli.formats import (
    echo_json,
    patient_key_for,
)
from inturn.worker.cli.options import (
    ITEM_ID,
    audit_who_option,
    dsn_option,
    json_option,
    payload_keys_options,
    why_for,
)
from inturn.worker.errors import ReasonRequired
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.operations import privacy
from inturn.worker.operations.actor import Trusted
from inturn.worker.store.connect import Pools

patient_id_option = click.option(
    "--patient-id",
    help="Only the items naming this patient ID in PID-2, PID-3, PID-4 or MRG-1 (indexed).",
)
authority_option = click.option(
    "--authority",
    help="With --patient-id: only identifiers assigned by this authority (CX-4 namespace or"
    " universal ID).",
)


@click.command("payload")
@dsn_option()
@click.argument("item_id", type=ITEM_ID)
@audit_who_option
@why_for("view-payload")
@click.option(
    "--as-sent",
    is_flag=True,
    help="Write the message as its destination's receiver profile (spec.profile) shapes it for"
    " the receiver, not as stored.",
)
@payload_keys_options
def payload_command(
    dsn: str | None,
    item_id: int,
    who: str,
    why: str | None,
    as_sent: bool,
    payload_keys: str | None,
    key_dsn: str | None,
) -> None:
    """Write one item's bytes to standard output exactly as stored (the viewing is audited).

    These are the stored bytes: ingest stores a message with its segment terminators already
    normalised (HL7 terminators: LF and CRLF become CR); the rule is applied here too, and
    changes nothing, so that rows stored before it print what is sent. An encrypted payload is
    decrypted with --payload-keys (and refused in one line without them).

    A destination without a receiver profile sends exactly these bytes. With --as-sent, the
    message as its destination's profile shapes it for the receiver (the profile registered
    now; MSH-13: the number the message was sent with, or the next one for a message not sent
    yet, said on standard error); a message the profile refuses exits 1 naming the field and
    the value.
    """
    shown = act(
        dsn,
        lambda conn: with_payloads(
            payload_keys,
            key_dsn,
            lambda codec: privacy.view_payload(
                conn, Trusted(who), item_id, why, codec, as_sent=as_sent
            ),
        ),
    )
    data = shown.data
    sent = shown.as_sent
    if sent is not None:
        if sent.data is None:
            click.echo(
                f"inturn: error: item {item_id}: its destination's profile refuses it:"
                f" {sent.refusal}",
                err=True,
            )
            sys.exit(1)
        if not sent.shaped:
            click.echo("no receiver profile: the receiver gets the stored bytes", err=True)
        elif sent.sequence is not None and not sent.reserved:
            click.echo(
                f"MSH-13 {sent.sequence}: the number it would get if it were sent next",
                err=True,
            )
        data = sent.data
    sys.stdout.buffer.write(normalise_terminators(data))
    sys.stdout.buffer.flush()


@click.command("erase")
@dsn_option()
@click.argument("item_ids", type=ITEM_ID, nargs=-1)
@click.option(
    "--patient-id",
    help="Erase every held message naming this ID in PID-2, PID-3, PID-4 or MRG-1.",
)
@authority_option
@click.option(
    "--scan",
    is_flag=True,
    help="Find the patient by reading every payload instead of the index (slow: says how long).",
)
@click.option(
    "--who",
    help="Who decides (recorded in the audit); not needed for a dry run by ITEM_IDS.",
)
@click.option(
    "--why",
    help="Why (recorded in the audit); not needed for a dry run by ITEM_IDS (a dry run by"
    " --patient-id is a search by patient, audited as search-patient).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be erased; erase nothing.")
@json_option
@payload_keys_options
def erase_command(
    dsn: str | None,
    item_ids: tuple[int, ...],
    patient_id: str | None,
    authority: str | None,
    scan: bool,
    who: str | None,
    why: str | None,
    dry_run: bool,
    as_json: bool,
    payload_keys: str | None,
    key_dsn: str | None,
) -> None:
    """Erase items in any state (data-subject erasure), by id or by patient identifier.

    With --payload-keys, erasing by --patient-id also destroys the patient's keys in the key
    store, after the rows: every copy of their messages elsewhere (a backup, a dump, a
    replica) can no longer be read. If the key store fails, the rows are gone and the command
    says so; run it again to destroy the keys (it finds no rows and destroys them).

    A dry run by --patient-id looks a patient up as `queue list --patient-id` and the console
    do: it needs --who and --why and is audited (search-patient, the ids found).
    """
    if bool(item_ids) == bool(patient_id and patient_id.strip()):
        raise click.UsageError("give exactly one of ITEM_IDS or a non-empty --patient-id")
    if who is None and (patient_id or not dry_run):
        raise click.UsageError("missing option '--who' (it is recorded in the audit)")
    if (authority is not None or scan) and not patient_id:
        raise click.UsageError("--authority and --scan go with --patient-id")
    patient_key_for(patient_id, authority)  # a blank --authority is a usage error
    actor = Trusted(who or "")

    def go(pools: Pools) -> Awaitable[privacy.Erasure]:
        return with_payloads(
            payload_keys,
            key_dsn,
            lambda codec: privacy.erase_data_subject(
                pools,
                actor,
                why,
                item_ids=item_ids,
                patient_id=patient_id,
                authority=authority,
                scan=scan,
                progress=lambda text: click.echo(text, err=True),
                payloads=codec,
                dry_run=dry_run,
            ),
        )

    try:
        done = run_db(dsn, go)
    except ReasonRequired as exc:
        raise click.UsageError(f"{exc} (--why)") from None
    except privacy.KeysNotDestroyed as exc:
        raise click.ClickException(str(exc)) from None
    matched, erased, destroyed = list(done.matched), done.erased, done.keys_destroyed
    if as_json:
        echo_json(
            {
                "matched": [m.to_json() for m in matched],
                "erased": list(erased),
                "dryRun": dry_run,
                "keysDestroyed": destroyed,
            }
        )
        return
    for m in matched:
        click.echo(f"{m.id}  {m.destination}  {m.state}  {m.message_type}")
    verb = "would erase" if dry_run else "erased"
    if matched or not item_ids:
        click.echo(f"{verb} {len(matched) if dry_run else len(erased)} item(s)")
    if destroyed is not None:
        click.echo(f"destroyed {destroyed} patient key(s) (recorded in the key store)")
    missing = sorted(set(item_ids) - {m.id for m in matched})
    if missing:
        raise click.ClickException(f"no item {', '.join(map(str, missing))}")

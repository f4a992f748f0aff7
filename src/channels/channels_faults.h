// Test-only switches that remove one protection each from the channels, so the tests can show
// they catch its absence (docs/channels.md, "Tests"). Never set outside tests; the library
// reads them on the calling threads (relaxed atomics).
#pragma once

namespace farmem::channels {

namespace testing {
// TEST ONLY: TicketLock::lock takes a ticket but does not wait for its turn.
void SetLockWaitDisabled(bool disabled);
// TEST ONLY: accept owned-variable copies without checking their checksum (shows torn values).
void SetOwnedChecksumDisabled(bool disabled);
// TEST ONLY: Barrier::arrive_and_wait publishes its arrival but does not wait for the others.
void SetBarrierWaitDisabled(bool disabled);
// TEST ONLY: accept ringbuffer records without checking their checksum (shows torn records).
void SetRingChecksumDisabled(bool disabled);
// TEST ONLY: the ringbuffer producer overwrites slots consumers have not released.
void SetRingBackpressureDisabled(bool disabled);
// TEST ONLY: SharedQueue::pop reads its slot without waiting until the pusher filled it.
void SetQueueWaitDisabled(bool disabled);
// TEST ONLY: KvStore::insert/erase do not wait for every node's tracker to acknowledge.
void SetKvAcksDisabled(bool disabled);
// TEST ONLY: KvStore::update releases the key's lock without the update fence.
void SetKvUpdateFenceDisabled(bool disabled);
// TEST ONLY: KvStore::get accepts a slot without checking its checksum (shows torn values).
void SetKvChecksumDisabled(bool disabled);
// TEST ONLY: a ringbuffer push that reached only some consumers does not use its seq (the next
// record gets the same number, which the consumers it reached skip).
void SetRingPartialSeqDisabled(bool disabled);
// TEST ONLY: a failed KvStore modification is not undone: no local undo, no abort record, no
// tracker ring room reserved before an erase's linearization point (the behaviour before the
// roll-back was built; docs/channels.md "Failed modifications").
void SetKvRollbackDisabled(bool disabled);
// TEST ONLY: a KvStore modification does not apply the records its lock's catch-up row names
// before it looks the key up.
void SetKvCatchUpDisabled(bool disabled);
// TEST ONLY: the tracker applies an insert record even over a newer index entry (higher ticket).
void SetKvTicketOrderDisabled(bool disabled);
}  // namespace testing

}  // namespace farmem::channels

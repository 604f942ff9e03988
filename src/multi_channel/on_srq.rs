//! A [`MultiChannel`] whose peers share one receive queue (`MultiChannel<P, PEERS, DEPTH,
//! SGES, RcOnSrq>`): each peer's channel sends, writes, reads and runs atomics as any
//! channel, but has no receive queue, ring or inbox of its own. Messages from every peer
//! land in receive slots the multi-channel owns, posted to one SRQ
//! ([`SlotsConfig`](crate::srq::SlotsConfig)): receive memory is the slots', whatever the
//! number of peers.
//!
//! - [`gather_receive`](MultiChannel::gather_receive) waits for messages from any peers
//!   (as many as fit, within the channels' timeout), [`poll_received`](MultiChannel::poll_received)
//!   takes what has arrived without waiting; each [`Received`] names the peer (by the
//!   queue pair that consumed the receive) and the slot, read with
//!   [`received`](MultiChannel::received) and handed back with
//!   [`release`](MultiChannel::release).
//! - Handed-back slots are posted again once no more than `refill_at` remain posted, or
//!   when the SRQ's limit event, handed to [`on_async_event`](MultiChannel::on_async_event),
//!   says it runs low. A peer that floods the SRQ does not starve the quiet ones of
//!   anything but time: once slots are released, their messages land (senders wait on RNR
//!   NAKs meanwhile, nothing is lost).
//! - A receive that fails (a message longer than a slot, a peer's queue pair in error)
//!   frees its slot and is the peer's [`outcome`](MultiChannel::outcome); the call that
//!   meets it, or the next one if that call has messages to return, reports it.
//!
//! ```
//! use zverbs::provider::sim::Sim;
//! use zverbs::multi_channel::Received;
//! use zverbs::qp::RcOnSrq;
//! use zverbs::srq::SlotsConfig;
//! use zverbs::{ChannelConfig, Context, MultiChannel};
//! let sim = Sim::with_devices(3);
//! let ctx: Vec<_> = (0..3).map(|i| Context::open(&sim, &format!("sim{i}")).unwrap()).collect();
//! let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
//! let cfg = ChannelConfig::default();
//! let slots = SlotsConfig { slots: 8, size: 64, refill_at: 2, ..SlotsConfig::default() };
//! // Rank 0 receives from ranks 1 and 2 through one SRQ; they send on plain channels.
//! let root = MultiChannel::<Sim, 3, 4, 1, RcOnSrq>::prepare_on_srq(&ctx[0], &pd[0], [1, 2], &cfg, &slots).unwrap();
//! let l1 = MultiChannel::<Sim, 1, 4, 1>::prepare(&ctx[1], &pd[1], [0], &cfg).unwrap();
//! let l2 = MultiChannel::<Sim, 1, 4, 1>::prepare(&ctx[2], &pd[2], [0], &cfg).unwrap();
//! let (e1, e2) = (l1.endpoint(0).unwrap(), l2.endpoint(0).unwrap());
//! let (r1, r2) = (root.endpoint(1).unwrap(), root.endpoint(2).unwrap());
//! let mut root = root.connect(|p| [None, Some(e1), Some(e2)][p]).unwrap();
//! let mut l1 = l1.connect(|_| Some(r1)).unwrap();
//! let mut l2 = l2.connect(|_| Some(r2)).unwrap();
//!
//! let (mut one, mut two) = (*b"from one", *b"from two");
//! l1.peer(0).unwrap().send([pd[1].register(&mut one).unwrap().slice(..).unwrap()]).unwrap();
//! l2.peer(0).unwrap().send([pd[2].register(&mut two).unwrap().slice(..).unwrap()]).unwrap();
//! let mut got = [Received::NONE; 2];
//! let mut n = 0;
//! while n < 2 {
//!     n += root.gather_receive(&mut got[n..]).unwrap();
//! }
//! for r in got {
//!     let expect: &[u8] = if r.peer == 1 { b"from one" } else { b"from two" };
//!     assert_eq!(root.received(r.slot).unwrap(), expect);
//!     root.release(r.slot).unwrap();
//! }
//! ```

use super::{named_peers, new_slots, shared_queue, MultiChannel, PreparedMultiChannel};
use crate::channel::{config_of, Channel, ChannelConfig, CqLayout, PreparedChannel};
use crate::device::{Context, ProtectionDomain};
use crate::error::{CompletionError, Error};
use crate::provider::Provider;
use crate::qp::RcOnSrq;
use crate::srq::{RecvSlot, SlotPool, SlotsConfig};
use crate::types::{AsyncEvent, WcOpcode, WorkCompletion};
use crate::wr_id::GroupId;

/// A message a peer sent, in a receive slot of the multi-channel's SRQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// The peer whose queue pair consumed the receive.
    pub peer: usize,
    /// Where the message is, its length and immediate data.
    pub slot: RecvSlot,
}

impl Received {
    /// A placeholder to fill arrays with before a receive call (no slot: refused by
    /// [`received`](MultiChannel::received) and [`release`](MultiChannel::release)).
    pub const NONE: Received = Received {
        peer: usize::MAX,
        slot: RecvSlot {
            index: u32::MAX,
            len: 0,
            imm: None,
        },
    };
}

/// The receive side of a multi-channel on an SRQ: the slots, which peer each queue pair
/// is, and a receive failure still to report.
pub struct SrqReceives<P: Provider> {
    pool: SlotPool<P>,
    /// `(qp_num, peer)` for every peer, sorted: a completion's peer in O(log peers).
    by_qpn: Box<[(u32, u32)]>,
    /// A failed receive met by a call that had messages to return: the next call's error.
    failed: Option<Error<P::Error>>,
}

/// Completions taken from the SRQ's queue per poll.
const POLL_BATCH: usize = 16;

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    MultiChannel<P, PEERS, DEPTH, SGES, RcOnSrq>
{
    /// Creates, for each peer index in `peers`, a channel whose queue pair takes its
    /// receives from one SRQ, and the SRQ with `slots` receive slots, all posted (before
    /// any peer can send). Sends complete as [`prepare`](MultiChannel::prepare)'s do (one
    /// shared queue, or one per channel: `config.completion_queues`); receives on one
    /// queue of the SRQ's.
    ///
    /// # Errors
    /// [`Error::NoSuchPeer`] / [`Error::InvalidAttribute`] for peer indices, as
    /// [`prepare`](MultiChannel::prepare); [`Error::InvalidAttribute`] for slots without a
    /// count or size, or `refill_at` or `limit` not below `slots`; [`Error::Unsupported`]
    /// on a device without SRQs; the provider's errors.
    pub fn prepare_on_srq(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: impl IntoIterator<Item = usize>,
        config: &ChannelConfig,
        slots: &SlotsConfig,
    ) -> Result<PreparedMultiChannel<P, PEERS, DEPTH, SGES, RcOnSrq>, Error<P::Error>> {
        let named = named_peers::<P, PEERS>(peers)?;
        let count = named.iter().filter(|&&n| n).count();
        let pool = SlotPool::new(ctx, pd, slots, slots.slots)?;
        let shared = config_of(config);
        let send = match config.completion_queues {
            CqLayout::Shared if count > 0 => Some(shared_queue::<P, DEPTH>(ctx, config, count)?),
            _ => None,
        };
        let backend = pool.backend();
        let mut chans = new_slots::<PreparedChannel<P, DEPTH, SGES, RcOnSrq>, PEERS>();
        let mut by_qpn = Vec::with_capacity(count);
        for (p, (slot, _)) in chans
            .iter_mut()
            .zip(named)
            .enumerate()
            .filter(|(_, (_, n))| *n)
        {
            let ch = Channel::prepare_on_srq_with(ctx, pd, shared.clone(), send.as_ref(), backend)?;
            // `p < PEERS`, and `PEERS` peers fit in memory as channels: below 2^32 for any
            // provider whose queue pair numbers are 24 bits.
            by_qpn.push((ch.endpoint().qp_num, p as u32));
            *slot = Some(ch);
        }
        by_qpn.sort_unstable();
        Ok(PreparedMultiChannel {
            peers: chans,
            receives: SrqReceives {
                pool,
                by_qpn: by_qpn.into_boxed_slice(),
                failed: None,
            },
        })
    }

    /// Takes the messages that have arrived, up to `out.len()` (and 16 per call), without
    /// waiting; posts handed-back slots again if the SRQ runs low. Returns how many.
    ///
    /// # Errors
    /// A receive that failed: its [`Error::Completion`] (naming the queue pair; the peer's
    /// [`outcome`](MultiChannel::outcome) holds it too), its slot free again;
    /// [`Error::UnexpectedCompletion`] for a completion the multi-channel did not post
    /// for; the provider's error (a dead device).
    pub fn poll_received(&mut self, out: &mut [Received]) -> Result<usize, Error<P::Error>> {
        if let Some(e) = self.receives.failed.take() {
            return Err(e);
        }
        let mut wcs = [WorkCompletion::EMPTY; POLL_BATCH];
        let want = out.len().min(POLL_BATCH);
        let polled = self.receives.pool.cq().poll(&mut wcs[..want])?;
        let mut n = 0;
        for wc in &wcs[..polled] {
            match self.take(wc) {
                Ok(r) => {
                    out[n] = r;
                    n += 1;
                }
                Err(e) => {
                    self.receives.failed.get_or_insert(e);
                }
            }
        }
        self.receives.pool.refill_if_low()?;
        match self.receives.failed.take() {
            Some(e) if n == 0 => Err(e),
            failed => {
                self.receives.failed = failed;
                Ok(n)
            }
        }
    }

    /// Waits for messages from any peers until `out` is full or the channels'
    /// [`timeout`](ChannelConfig::timeout) passes, pausing by their wait policy between
    /// polls (spinning, then yielding: the SRQ's queue raises no events). Returns how many
    /// arrived: `out.len()`, or fewer once the timeout passed with some there.
    ///
    /// # Errors
    /// [`Error::Timeout`] if none arrived; otherwise as
    /// [`poll_received`](Self::poll_received), whose messages already taken are returned
    /// first (the error comes with the next call).
    pub fn gather_receive(&mut self, out: &mut [Received]) -> Result<usize, Error<P::Error>> {
        let mut waiter = self.waiter();
        let mut n = 0;
        while n < out.len() {
            match self.poll_received(&mut out[n..]) {
                Ok(0) => {
                    if !waiter.pause() {
                        break;
                    }
                }
                Ok(got) => n += got,
                Err(e) if n == 0 => return Err(e),
                Err(e) => {
                    self.receives.failed = Some(e);
                    break;
                }
            }
        }
        match n {
            0 if !out.is_empty() => Err(Error::Timeout),
            n => Ok(n),
        }
    }

    /// The message in `slot` (its `len` bytes), until it is handed back.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message (handed back already,
    /// or [`Received::NONE`]).
    pub fn received(&self, slot: RecvSlot) -> Result<&[u8], Error<P::Error>> {
        self.receives.pool.received(slot)
    }

    /// Hands `slot` back, to be posted again (at once if the SRQ runs low).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message; the provider's error
    /// from the refill.
    pub fn release(&mut self, slot: RecvSlot) -> Result<(), Error<P::Error>> {
        self.receives.pool.release(slot)
    }

    /// Hands the multi-channel an asynchronous event of its device (from
    /// [`Context::next_async_event`](crate::Context::next_async_event)):
    /// `SRQ_LIMIT_REACHED` for its SRQ (armed with [`SlotsConfig::limit`]) posts every
    /// handed-back slot and arms the limit again. Returns whether the event was its.
    ///
    /// # Errors
    /// The provider's error from the refill or the arm.
    pub fn on_async_event(&mut self, ev: &AsyncEvent) -> Result<bool, Error<P::Error>> {
        self.receives.pool.on_async_event(ev)
    }

    /// What the receive completion `wc` means: a message, or the error of a failed
    /// receive (recorded as its peer's outcome).
    fn take(&mut self, wc: &WorkCompletion) -> Result<Received, Error<P::Error>> {
        let unexpected = Error::UnexpectedCompletion { wr_id: wc.wr_id };
        let by_qpn = &self.receives.by_qpn;
        let peer = match by_qpn.binary_search_by_key(&wc.qp_num, |&(qpn, _)| qpn) {
            Ok(i) => by_qpn[i].1 as usize,
            Err(_) => return Err(unexpected),
        };
        let Some(GroupId::Recv(index)) = GroupId::decode(wc.wr_id) else {
            return Err(unexpected);
        };
        match self.receives.pool.complete(index, wc) {
            Some(Ok(slot)) => Ok(Received { peer, slot }),
            Some(Err(status)) => {
                let e = Error::Completion(CompletionError {
                    status,
                    wr_id: wc.wr_id,
                    opcode: WcOpcode::Recv,
                    qp_num: wc.qp_num,
                    peer_qp_num: self.peers[peer]
                        .as_ref()
                        .and_then(|c| c.queue_pair().peer_qp_num()),
                });
                self.outcomes[peer] = Some(Err(e.clone()));
                Err(e)
            }
            None => Err(unexpected),
        }
    }
}

//! Async collectives over a fixed set of peers, where they are cheap: one operation per
//! peer, all posted at once and awaited together, with no allocation (the futures of one
//! call live in an array, polled in place).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context as TaskContext, Poll};

use super::{AsyncChannel, BufResult, IoBuf};
use crate::mr::RemoteRegion;
use crate::provider::Provider;
use crate::ring::Completion;

/// `PEERS` async channels, one per peer, driven together. Each call takes one owned
/// buffer per peer and gives all of them back with their results, peer by peer: one
/// peer's failure does not hide the others' outcomes.
///
/// ```
/// # #[cfg(feature = "sim")] {
/// # use zverbs::provider::sim::Sim;
/// # use zverbs::tokio::{AsyncChannel, AsyncGroup};
/// # use zverbs::{ChannelConfig, Context, MrPool};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let sim = Sim::with_devices(3);
/// # let cfg = ChannelConfig::default();
/// # let ctx: Vec<_> = (0..3).map(|i| Context::open(&sim, &format!("sim{i}")).unwrap()).collect();
/// # let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
/// # let mut pair = |i: usize| {
/// #     let a = AsyncChannel::<Sim>::prepare(&ctx[0], &pd[0], &cfg).unwrap();
/// #     let b = AsyncChannel::<Sim>::prepare(&ctx[i], &pd[i], &cfg).unwrap();
/// #     let (ea, eb) = (a.endpoint(), b.endpoint());
/// #     (AsyncChannel::new(a.connect(&eb).unwrap()).unwrap(), AsyncChannel::new(b.connect(&ea).unwrap()).unwrap())
/// # };
/// # let ((to1, at1), (to2, at2)) = (pair(1), pair(2));
/// # let pools: Vec<_> = pd.iter().map(|p| MrPool::new(p, 1 << 16).unwrap()).collect();
/// let root = AsyncGroup::new([to1, to2]);
/// let parts = [b"one".as_slice(), b"two"].map(|p| {
///     let mut buf = pools[0].alloc(3).unwrap();
///     buf.copy_from_slice(p);
///     buf
/// });
/// let (sent, got1, got2) = tokio::join!(
///     root.scatter(parts),
///     at1.receive(pools[1].alloc(8).unwrap()),
///     at2.receive(pools[2].alloc(8).unwrap()),
/// );
/// assert!(sent.iter().all(|(r, _)| r.is_ok()));
/// assert_eq!(&got1.1[..3], b"one");
/// assert_eq!(&got2.1[..3], b"two");
/// # });
/// # }
/// ```
pub struct AsyncGroup<
    P: Provider,
    const PEERS: usize,
    B: IoBuf = crate::pool::LocalBuf<P>,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
> {
    peers: [AsyncChannel<P, B, DEPTH, SGES>; PEERS],
}

impl<
        P: Provider + 'static,
        const PEERS: usize,
        B: IoBuf,
        const DEPTH: usize,
        const SGES: usize,
    > AsyncGroup<P, PEERS, B, DEPTH, SGES>
{
    /// The group of `peers` (peer `i` is `peers[i]`).
    pub fn new(peers: [AsyncChannel<P, B, DEPTH, SGES>; PEERS]) -> Self {
        AsyncGroup { peers }
    }

    /// Peer `i`'s channel.
    pub fn peer(&self, i: usize) -> Option<&AsyncChannel<P, B, DEPTH, SGES>> {
        self.peers.get(i)
    }

    /// Sends `bufs[i]` to peer `i`, all at once.
    pub async fn scatter(&self, bufs: [B; PEERS]) -> [BufResult<(), B, P::Error>; PEERS] {
        let mut bufs = bufs.map(Some);
        let futs = core::array::from_fn(|i| {
            let buf = bufs[i].take().expect("each buffer is taken once");
            self.peers[i].send(buf)
        });
        JoinArray::new(futs).await
    }

    /// Receives one message from each peer, peer `i`'s into `bufs[i]`.
    pub async fn gather(&self, bufs: [B; PEERS]) -> [BufResult<Completion, B, P::Error>; PEERS] {
        let mut bufs = bufs.map(Some);
        let futs = core::array::from_fn(|i| {
            let buf = bufs[i].take().expect("each buffer is taken once");
            self.peers[i].receive(buf)
        });
        JoinArray::new(futs).await
    }

    /// Writes `bufs[i]` to `remotes[i]` at peer `i`, all at once.
    pub async fn write_all(
        &self,
        bufs: [B; PEERS],
        remotes: &[RemoteRegion; PEERS],
    ) -> [BufResult<(), B, P::Error>; PEERS] {
        let mut bufs = bufs.map(Some);
        let futs = core::array::from_fn(|i| {
            let buf = bufs[i].take().expect("each buffer is taken once");
            self.peers[i].write(buf, &remotes[i])
        });
        JoinArray::new(futs).await
    }
}

/// Awaits an array of futures together; their outputs in the same order.
struct JoinArray<F: Future, const PEERS: usize> {
    futs: [Slot<F>; PEERS],
}

enum Slot<F: Future> {
    Running(F),
    Done(F::Output),
    Taken,
}

impl<F: Future, const PEERS: usize> JoinArray<F, PEERS> {
    fn new(futs: [F; PEERS]) -> Self {
        JoinArray {
            futs: futs.map(Slot::Running),
        }
    }
}

impl<F: Future, const PEERS: usize> Future for JoinArray<F, PEERS> {
    type Output = [F::Output; PEERS];

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        // SAFETY: the futures are never moved out of the array: a finished one is dropped
        // in place (by assigning its slot), which pinning allows; nothing else is moved.
        let this = unsafe { self.get_unchecked_mut() };
        let mut pending = false;
        for slot in this.futs.iter_mut() {
            if let Slot::Running(f) = slot {
                // SAFETY: `f` lives in the pinned array and stays there until dropped (above).
                match unsafe { Pin::new_unchecked(f) }.poll(cx) {
                    Poll::Ready(out) => *slot = Slot::Done(out),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(core::array::from_fn(|i| {
            match core::mem::replace(&mut this.futs[i], Slot::Taken) {
                Slot::Done(out) => out,
                // Every slot was Done when the loop found nothing pending, and a JoinArray
                // is not polled after it finished (a future's contract).
                _ => panic!("JoinArray polled after it finished"),
            }
        }))
    }
}

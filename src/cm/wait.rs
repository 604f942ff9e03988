//! Waiting for the manager's events on its descriptor, by a deadline.

use std::time::{Duration, Instant};

use super::CmError;
use crate::provider::cm::{CmEvent, CmEventKind, ConnectionManager};

/// When a call must be done by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(timeout))
    }

    /// What is left (`None`: unbounded).
    fn left(self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(Instant::now()))
    }

    pub(crate) fn passed(self) -> bool {
        self.left() == Some(Duration::ZERO)
    }
}

/// The next event of `events`, sleeping on its descriptor until one comes or the
/// deadline passes.
pub(super) fn next_event<P: ConnectionManager>(
    events: &P::CmChannel,
    deadline: Deadline,
) -> Result<CmEvent<P>, CmError<P::Error>> {
    loop {
        if let Some(ev) = P::get_cm_event(events).map_err(CmError::Verbs)? {
            return Ok(ev);
        }
        let left = deadline.left();
        if left == Some(Duration::ZERO) {
            return Err(CmError::Timeout {
                waiting_for: CmEventKind::Established,
            });
        }
        // At most 100 ms a sleep: the deadline is checked again however the wait ends.
        let ms = left.map_or(100, |l| l.as_millis().clamp(1, 100) as i32);
        let mut pfd = libc::pollfd {
            fd: P::cm_channel_fd(events),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the call's duration; poll(2) writes only
        // its `revents`.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }
}

/// The next event of any of `channels`, with the index of its channel, sleeping on their
/// descriptors until one comes or the deadline passes.
pub(crate) fn next_event_of<P: ConnectionManager>(
    channels: &[&P::CmChannel],
    deadline: Deadline,
) -> Result<(usize, CmEvent<P>), CmError<P::Error>> {
    loop {
        for (i, ch) in channels.iter().enumerate() {
            if let Some(ev) = P::get_cm_event(ch).map_err(CmError::Verbs)? {
                return Ok((i, ev));
            }
        }
        let left = deadline.left();
        if left == Some(Duration::ZERO) {
            return Err(CmError::Timeout {
                waiting_for: CmEventKind::Established,
            });
        }
        let ms = left.map_or(100, |l| l.as_millis().clamp(1, 100) as i32);
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 2];
        let n = channels.len().min(fds.len());
        for (fd, ch) in fds.iter_mut().zip(channels) {
            *fd = libc::pollfd {
                fd: P::cm_channel_fd(ch),
                events: libc::POLLIN,
                revents: 0,
            };
        }
        // SAFETY: `fds` holds `n` valid pollfds for the call's duration; poll(2) writes
        // only their `revents`.
        unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, ms) };
    }
}

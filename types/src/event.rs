//! The device's asynchronous events (`ibv_get_async_event`): what happened to a queue
//! pair, a completion queue, a shared receive queue, a port or the whole device, outside
//! any work request.

/// What an asynchronous event reports (`enum ibv_event_type`; [`raw`](Self::raw) is the
/// verbs value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// A completion queue overflowed (`IBV_EVENT_CQ_ERR`): completions were lost, and the
    /// queue pairs on it moved to ERR.
    CqErr,
    /// A queue pair hit an error that no completion can report (`IBV_EVENT_QP_FATAL`).
    QpFatal,
    /// A responder found a request invalid (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr,
    /// A responder found an access violation (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr,
    /// A queue pair in RTR received its first packet (`IBV_EVENT_COMM_EST`).
    CommEst,
    /// A queue pair's send queue drained (`IBV_EVENT_SQ_DRAINED`).
    SqDrained,
    /// A queue pair migrated to its alternate path (`IBV_EVENT_PATH_MIG`).
    PathMig,
    /// Path migration failed (`IBV_EVENT_PATH_MIG_ERR`).
    PathMigErr,
    /// The device failed for good (`IBV_EVENT_DEVICE_FATAL`): every queue pair, queue and
    /// port of it is gone.
    DeviceFatal,
    /// A port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive,
    /// A port went down (`IBV_EVENT_PORT_ERR`).
    PortErr,
    /// A port's LID changed (`IBV_EVENT_LID_CHANGE`).
    LidChange,
    /// A port's P_Key table changed (`IBV_EVENT_PKEY_CHANGE`).
    PkeyChange,
    /// The subnet manager changed (`IBV_EVENT_SM_CHANGE`).
    SmChange,
    /// A shared receive queue failed (`IBV_EVENT_SRQ_ERR`).
    SrqErr,
    /// A shared receive queue fell below its armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached,
    /// A queue pair on a shared receive queue will take no more of its receives
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`): it may be destroyed.
    QpLastWqeReached,
    /// The subnet manager asks for registrations again (`IBV_EVENT_CLIENT_REREGISTER`).
    ClientReregister,
    /// A port's GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange,
    /// A work queue failed (`IBV_EVENT_WQ_FATAL`).
    WqFatal,
    /// A value with no name here (a newer library's), as reported.
    Unknown(u32),
}

impl AsyncEventKind {
    const NAMED: [AsyncEventKind; 20] = [
        AsyncEventKind::CqErr,
        AsyncEventKind::QpFatal,
        AsyncEventKind::QpReqErr,
        AsyncEventKind::QpAccessErr,
        AsyncEventKind::CommEst,
        AsyncEventKind::SqDrained,
        AsyncEventKind::PathMig,
        AsyncEventKind::PathMigErr,
        AsyncEventKind::DeviceFatal,
        AsyncEventKind::PortActive,
        AsyncEventKind::PortErr,
        AsyncEventKind::LidChange,
        AsyncEventKind::PkeyChange,
        AsyncEventKind::SmChange,
        AsyncEventKind::SrqErr,
        AsyncEventKind::SrqLimitReached,
        AsyncEventKind::QpLastWqeReached,
        AsyncEventKind::ClientReregister,
        AsyncEventKind::GidChange,
        AsyncEventKind::WqFatal,
    ];

    /// The kind of verbs value `v` (`IBV_EVENT_CQ_ERR` is 0, in `enum ibv_event_type`'s
    /// order).
    pub fn from_raw(v: u32) -> AsyncEventKind {
        Self::NAMED
            .get(v as usize)
            .copied()
            .unwrap_or(AsyncEventKind::Unknown(v))
    }

    /// The verbs value.
    pub fn raw(self) -> u32 {
        match self {
            AsyncEventKind::Unknown(v) => v,
            named => Self::NAMED.iter().position(|&k| k == named).unwrap_or(0) as u32,
        }
    }
}

/// What an asynchronous event is about (`ibv_async_event.element`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A queue pair, by its number.
    Qp(u32),
    /// A completion queue, by its key (`Provider::cq_key`).
    Cq(u64),
    /// A shared receive queue, by its key.
    Srq(u64),
    /// A port (1-based).
    Port(u8),
    /// The whole device.
    Device,
}

/// One asynchronous event of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// To what.
    pub element: EventElement,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_verbs_values() {
        for v in 0..20 {
            let k = AsyncEventKind::from_raw(v);
            assert!(!matches!(k, AsyncEventKind::Unknown(_)), "{v}");
            assert_eq!(k.raw(), v);
        }
        assert_eq!(AsyncEventKind::from_raw(8), AsyncEventKind::DeviceFatal);
        assert_eq!(
            AsyncEventKind::from_raw(15),
            AsyncEventKind::SrqLimitReached
        );
        assert_eq!(AsyncEventKind::from_raw(42), AsyncEventKind::Unknown(42));
        assert_eq!(AsyncEventKind::Unknown(42).raw(), 42);
    }
}

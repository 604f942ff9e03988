//! The verbs backend's error: an errno from a named verb, or a typed reason.

use std::fmt;

use crate::error::{ErrorKind, ProviderError};

/// Linux errno values the verbs library and the kernel return (`<errno.h>`, asm-generic).
/// Local constants: the verbs adapter is Linux-only and the crate takes no `libc` dependency.
pub(crate) mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const ENXIO: i32 = 6;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EACCES: i32 = 13;
    pub const EFAULT: i32 = 14;
    pub const EBUSY: i32 = 16;
    pub const ENODEV: i32 = 19;
    pub const EINVAL: i32 = 22;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const ENOSPC: i32 = 28;
    pub const ERANGE: i32 = 34;
    pub const ENOSYS: i32 = 38;
    pub const ENODATA: i32 = 61;
    pub const EPROTONOSUPPORT: i32 = 93;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EAFNOSUPPORT: i32 = 97;
    pub const ETIMEDOUT: i32 = 110;
}

/// The symbolic name of an errno, for messages.
fn errno_name(e: i32) -> &'static str {
    use errno::*;
    match e {
        EPERM => "EPERM",
        ENOENT => "ENOENT",
        EIO => "EIO",
        ENXIO => "ENXIO",
        EAGAIN => "EAGAIN",
        ENOMEM => "ENOMEM",
        EACCES => "EACCES",
        EFAULT => "EFAULT",
        EBUSY => "EBUSY",
        ENODEV => "ENODEV",
        EINVAL => "EINVAL",
        ENFILE => "ENFILE",
        EMFILE => "EMFILE",
        ENOSPC => "ENOSPC",
        ERANGE => "ERANGE",
        ENOSYS => "ENOSYS",
        ENODATA => "ENODATA",
        EPROTONOSUPPORT => "EPROTONOSUPPORT",
        EOPNOTSUPP => "EOPNOTSUPP",
        EAFNOSUPPORT => "EAFNOSUPPORT",
        ETIMEDOUT => "ETIMEDOUT",
        _ => "errno",
    }
}

/// What [`VerbsError::NoSuchDevice`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoSuchDevice {
    /// The name asked for.
    pub name: String,
    /// The names of the devices present (may be empty).
    pub present: Vec<String>,
}

/// An error of the verbs backend.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerbsError {
    /// A verb failed with an errno.
    Os {
        /// The verb, e.g. `"ibv_modify_qp"`.
        verb: &'static str,
        /// The errno it returned or set.
        errno: i32,
    },
    /// No device has the requested name. Boxed: every `Result` of a post or a poll carries
    /// this type, and an inline name and list would make it twice as large.
    NoSuchDevice(Box<NoSuchDevice>),
    /// A value cannot be passed to the verbs library (e.g. a depth above `i32::MAX`).
    Invalid(&'static str),
    /// The device's provider library does not implement an operation.
    Unsupported(&'static str),
    /// No GID table entry of the port suits the selection.
    NoGid {
        /// The port searched.
        port: u8,
    },
    /// The device reported `IBV_EVENT_DEVICE_FATAL`: every later empty poll of its
    /// completion queues fails so.
    DeviceFatal,
}

impl VerbsError {
    /// An errno from `verb`; a zero errno (the library failed without setting one) becomes
    /// `EIO` so that the error never reads as success.
    pub(crate) fn os(verb: &'static str, errno: i32) -> VerbsError {
        VerbsError::Os {
            verb,
            errno: if errno == 0 { errno::EIO } else { errno },
        }
    }

    /// The error of a verb that returned NULL and set `errno`.
    pub(crate) fn last_os(verb: &'static str) -> VerbsError {
        VerbsError::os(
            verb,
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        )
    }

    /// The error of a verb that returned `ret != 0`: libibverbs returns the errno itself
    /// (positive) from most verbs, and -1 with `errno` set (or a negated errno) from some.
    pub(crate) fn from_ret(verb: &'static str, ret: i32) -> VerbsError {
        match ret {
            -1 => VerbsError::last_os(verb),
            r if r < 0 => VerbsError::os(verb, r.saturating_neg()),
            r => VerbsError::os(verb, r),
        }
    }

    /// The errno, if this is an OS error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Os { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// `Ok(())` for a zero return, the errno otherwise.
pub(crate) fn check(verb: &'static str, ret: i32) -> Result<(), VerbsError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(VerbsError::from_ret(verb, ret))
    }
}

impl ProviderError for VerbsError {
    fn kind(&self) -> ErrorKind {
        use errno::*;
        match self {
            VerbsError::Os { verb, errno } => match *errno {
                // A post's ENOMEM means the work queue is full; elsewhere it means the
                // device or the kernel ran out of memory.
                ENOMEM if verb.starts_with("ibv_post") => ErrorKind::QueueFull,
                ENOMEM | EAGAIN | ENOSPC | EMFILE | ENFILE => ErrorKind::OutOfResources,
                EINVAL | EFAULT | ERANGE => ErrorKind::InvalidArgument,
                ENODEV | ENOENT | ENXIO | ENODATA => ErrorKind::NotFound,
                EBUSY => ErrorKind::Busy,
                EPERM | EACCES => ErrorKind::PermissionDenied,
                EOPNOTSUPP | ENOSYS | EPROTONOSUPPORT | EAFNOSUPPORT => ErrorKind::Unsupported,
                ETIMEDOUT => ErrorKind::Timeout,
                // After IBV_EVENT_DEVICE_FATAL (or a hot-unplug) the kernel disassociates
                // the context and every command fails with EIO.
                EIO => ErrorKind::DeviceFatal,
                _ => ErrorKind::Other,
            },
            VerbsError::NoSuchDevice(_) | VerbsError::NoGid { .. } => ErrorKind::NotFound,
            VerbsError::Invalid(_) => ErrorKind::InvalidArgument,
            VerbsError::Unsupported(_) => ErrorKind::Unsupported,
            VerbsError::DeviceFatal => ErrorKind::DeviceFatal,
        }
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::Os { verb, errno } => write!(
                f,
                "{verb}: {} ({}, errno {errno})",
                std::io::Error::from_raw_os_error(*errno),
                errno_name(*errno)
            ),
            VerbsError::NoSuchDevice(d) => {
                let NoSuchDevice { name, present } = &**d;
                write!(f, "no RDMA device named {name:?}; devices present: ")?;
                if present.is_empty() {
                    f.write_str("none")
                } else {
                    f.write_str(&present.join(", "))
                }
            }
            VerbsError::Invalid(why) => write!(f, "invalid argument: {why}"),
            VerbsError::Unsupported(op) => {
                write!(f, "the device's verbs provider does not implement {op}")
            }
            VerbsError::NoGid { port } => write!(f, "port {port} has no usable GID"),
            VerbsError::DeviceFatal => f.write_str("the device is dead (IBV_EVENT_DEVICE_FATAL)"),
        }
    }
}

impl std::error::Error for VerbsError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_maps_to_kind() {
        let k = |verb, e| VerbsError::os(verb, e).kind();
        assert_eq!(k("ibv_post_send", errno::ENOMEM), ErrorKind::QueueFull);
        assert_eq!(k("ibv_post_recv", errno::ENOMEM), ErrorKind::QueueFull);
        assert_eq!(k("ibv_create_qp", errno::ENOMEM), ErrorKind::OutOfResources);
        assert_eq!(
            k("ibv_modify_qp", errno::EINVAL),
            ErrorKind::InvalidArgument
        );
        assert_eq!(k("ibv_open_device", errno::ENODEV), ErrorKind::NotFound);
        assert_eq!(k("ibv_reg_mr", errno::EACCES), ErrorKind::PermissionDenied);
        assert_eq!(k("ibv_reg_mr", errno::EFAULT), ErrorKind::InvalidArgument);
        assert_eq!(k("ibv_destroy_qp", errno::EBUSY), ErrorKind::Busy);
        assert_eq!(
            k("ibv_create_cq", errno::EOPNOTSUPP),
            ErrorKind::Unsupported
        );
        assert_eq!(k("x", 9999), ErrorKind::Other);
        assert_eq!(k("ibv_modify_qp", errno::EIO), ErrorKind::DeviceFatal);
        assert_eq!(VerbsError::os("x", 0).errno(), Some(errno::EIO));
        assert_eq!(
            VerbsError::from_ret("x", -errno::EINVAL).errno(),
            Some(errno::EINVAL)
        );
        assert_eq!(
            VerbsError::from_ret("x", errno::EBUSY).errno(),
            Some(errno::EBUSY)
        );
    }

    #[test]
    fn messages_name_the_verb_and_the_devices() {
        let e = VerbsError::os("ibv_post_send", errno::ENOMEM);
        let s = e.to_string();
        assert!(s.starts_with("ibv_post_send: "), "{s}");
        assert!(s.contains("ENOMEM, errno 12"), "{s}");
        let e = VerbsError::NoSuchDevice(Box::new(NoSuchDevice {
            name: "rxe0".into(),
            present: vec!["mlx5_0".into(), "mlx5_1".into()],
        }));
        assert_eq!(
            e.to_string(),
            "no RDMA device named \"rxe0\"; devices present: mlx5_0, mlx5_1"
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let e = VerbsError::NoSuchDevice(Box::new(NoSuchDevice {
            name: "rxe0".into(),
            present: vec![],
        }));
        assert!(e.to_string().ends_with("devices present: none"));
    }
}

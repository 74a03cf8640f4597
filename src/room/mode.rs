//! The room's state (contract section 15) as every proxy follows it: open, paused or closed.
//! Where it lives and who changes it is told in `crate::services::control`.

/// The room's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Open,
    Paused,
    Closed,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Open, Mode::Paused, Mode::Closed];

    /// The word the contract, the scripts and the gauge use.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Open => "open",
            Mode::Paused => "paused",
            Mode::Closed => "closed",
        }
    }

    /// A state as stored; anything unknown (written by hand, or by a newer version) counts as
    /// open, as the scripts read it.
    pub fn parse(text: Option<&str>) -> Mode {
        match text {
            Some("paused") => Mode::Paused,
            Some("closed") => Mode::Closed,
            _ => Mode::Open,
        }
    }

    pub(crate) fn to_u8(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_u8(n: u8) -> Mode {
        Mode::ALL.get(n as usize).copied().unwrap_or(Mode::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_as_the_scripts_read_them() {
        assert_eq!(Mode::parse(None), Mode::Open);
        assert_eq!(Mode::parse(Some("paused")), Mode::Paused);
        assert_eq!(Mode::parse(Some("closed")), Mode::Closed);
        assert_eq!(Mode::parse(Some("weird")), Mode::Open);
        for m in Mode::ALL {
            assert_eq!(Mode::from_u8(m.to_u8()), m);
            assert_eq!(Mode::parse(Some(m.as_str())), m);
        }
    }
}

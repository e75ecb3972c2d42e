//! One spelling per value of a name-only enum: its table (`ALL`), `as_str`, `Display` and `FromStr`
//! come from a single `spelled!` declaration, so they cannot disagree, and a variant without a
//! spelling does not compile.

use thiserror::Error;

/// A spelling that names no value of an enum.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown {what} \"{value}\": one of {allowed}")]
pub struct UnknownName {
    /// What kind of value was asked for (`priority`).
    pub what: &'static str,
    /// What was given.
    pub value: String,
    /// Every spelling, comma-separated.
    pub allowed: String,
}

/// Declares the spellings of a name-only enum: `spelled!("priority", Priority { Low => "low", … })`
/// gives `Priority::ALL`, `as_str`, `Display` and `FromStr` (with [`UnknownName`]).
macro_rules! spelled {
    ($what:literal, $t:ident { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $t {
            /// Every value with its spelling, in declaration order.
            pub const ALL: &'static [($t, &'static str)] = &[$(($t::$v, $s)),+];

            /// The spelling of this value: what `Display` prints and `FromStr` accepts.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($t::$v => $s),+
                }
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $t {
            type Err = $crate::spelling::UnknownName;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .iter()
                    .find(|(_, n)| *n == s)
                    .map(|(v, _)| *v)
                    .ok_or_else(|| $crate::spelling::UnknownName {
                        what: $what,
                        value: s.to_string(),
                        allowed: Self::ALL
                            .iter()
                            .map(|(_, n)| *n)
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
            }
        }
    };
}
pub(crate) use spelled;

#[cfg(test)]
mod tests {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Colour {
        Red,
        DarkBlue,
    }
    spelled!("colour", Colour { Red => "red", DarkBlue => "dark-blue" });

    #[test]
    fn one_table_gives_every_conversion() {
        assert_eq!(Colour::DarkBlue.as_str(), "dark-blue");
        assert_eq!(Colour::Red.to_string(), "red");
        assert_eq!("dark-blue".parse::<Colour>(), Ok(Colour::DarkBlue));
        let e = "blue".parse::<Colour>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown colour \"blue\": one of red, dark-blue"
        );
        assert_eq!(Colour::ALL.len(), 2);
    }
}

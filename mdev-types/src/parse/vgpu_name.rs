//! NVIDIA vGPU type names such as `GRID T4-2Q`, `NVIDIA L40S-4Q`, `GRID M60-2B4`, `NVIDIA A100-4C`
//! or the MIG-backed `NVIDIA A100-1-10C`.
//!
//! Source: NVIDIA Virtual GPU Software User Guide, "Virtual GPU Types": a type is named
//! `<board>-<framebuffer GB><series>` where the series letter is A (virtual applications), B (virtual
//! PC), C (compute) or Q (workstation, RTX vWS); a few B types carry a head count after the letter
//! (`M60-2B4`); the `-0B`/`-0Q` types have 512 MB. MIG-backed compute types (guide section "MIG-Backed
//! vGPU types") put the number of GPU slices before the framebuffer: `A100-<slices>-<GB>C`. Names
//! start with `GRID ` (older releases) or `NVIDIA ` (vGPU 13 and later).

use serde::{Deserialize, Serialize};

use super::ParseError;

/// The vGPU series (the letter after the framebuffer size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NvidiaSeries {
    /// `A`: virtual applications (RDSH / app streaming).
    A,
    /// `B`: virtual PC (business desktops).
    B,
    /// `C`: compute (CUDA / AI, no display).
    C,
    /// `Q`: workstation (NVIDIA RTX Virtual Workstation).
    Q,
}

impl NvidiaSeries {
    /// The series letter as it appears in type names.
    pub fn letter(self) -> char {
        match self {
            Self::A => 'A',
            Self::B => 'B',
            Self::C => 'C',
            Self::Q => 'Q',
        }
    }

    /// The series for a type-name letter, if it is one.
    pub fn from_letter(c: char) -> Option<Self> {
        match c {
            'A' => Some(Self::A),
            'B' => Some(Self::B),
            'C' => Some(Self::C),
            'Q' => Some(Self::Q),
            _ => None,
        }
    }
}

/// A parsed NVIDIA vGPU type name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NvidiaVgpuName {
    /// The board, e.g. `T4`, `L40S`, `A100`, `RTXA6000`.
    pub board: String,
    /// The framebuffer in GB as named (`2` in `T4-2Q`); `0` names the 512 MB types (`M60-0B`).
    pub framebuffer_gib: u32,
    /// The series letter after the size (`Q` in `T4-2Q`).
    pub series: NvidiaSeries,
    /// The head count suffix (`4` in `M60-2B4`), when present.
    pub heads: Option<u32>,
    /// GPU slices of a MIG-backed type (`1` in `A100-1-10C`), when present.
    pub mig_slices: Option<u32>,
}

/// A decimal `u32` made only of ASCII digits, or `None`.
fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses a vGPU type name (`GRID T4-2Q`, `NVIDIA L40S-4Q`, `GRID M60-2B4`, `NVIDIA A100-1-10C`).
/// The `GRID `/`NVIDIA ` prefix is optional.
pub fn parse_nvidia_vgpu_name(text: &str) -> Result<NvidiaVgpuName, ParseError> {
    parse(text.trim()).ok_or_else(|| {
        ParseError::invalid(
            "NVIDIA vGPU type name",
            text,
            "[GRID |NVIDIA ]<board>-[<slices>-]<framebuffer GB><A|B|C|Q>[<heads>], e.g. NVIDIA L40S-4Q",
        )
    })
}

/// The parser proper; `None` for anything that is not a type name.
fn parse(v: &str) -> Option<NvidiaVgpuName> {
    let v = v
        .strip_prefix("GRID ")
        .or_else(|| v.strip_prefix("NVIDIA "))
        .unwrap_or(v);
    let (head, profile) = v.rsplit_once('-')?;

    let letter_at = profile.find(|c: char| !c.is_ascii_digit())?;
    let (fb, rest) = profile.split_at(letter_at);
    let mut rest_chars = rest.chars();
    let series = NvidiaSeries::from_letter(rest_chars.next()?)?;
    let heads_text = rest_chars.as_str();
    let heads = if heads_text.is_empty() {
        None
    } else {
        Some(number(heads_text)?)
    };

    let (board, mig_slices) = match head.rsplit_once('-') {
        Some((board, slices)) => (board, Some(number(slices)?)),
        None => (head, None),
    };
    let board_ok = !board.is_empty()
        && board.trim() == board
        && !board.chars().any(|c| c.is_control() || c == '-');
    if !board_ok {
        return None;
    }
    Some(NvidiaVgpuName {
        board: board.to_owned(),
        framebuffer_gib: number(fb)?,
        series,
        heads,
        mig_slices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(
        board: &str,
        fb: u32,
        series: NvidiaSeries,
        heads: Option<u32>,
        mig: Option<u32>,
    ) -> NvidiaVgpuName {
        NvidiaVgpuName {
            board: board.to_owned(),
            framebuffer_gib: fb,
            series,
            heads,
            mig_slices: mig,
        }
    }

    #[test]
    fn real_names() {
        use NvidiaSeries::*;
        let cases = [
            ("GRID T4-2Q", name("T4", 2, Q, None, None)),
            ("NVIDIA L40S-4Q\n", name("L40S", 4, Q, None, None)),
            ("GRID T4-2B4", name("T4", 2, B, Some(4), None)),
            ("GRID M60-0B", name("M60", 0, B, None, None)),
            ("NVIDIA A100-4C", name("A100", 4, C, None, None)),
            ("NVIDIA A100-1-10C", name("A100", 10, C, None, Some(1))),
            ("NVIDIA A100X-7-80C", name("A100X", 80, C, None, Some(7))),
            ("NVIDIA A16-1A", name("A16", 1, A, None, None)),
            ("NVIDIA L40S-48Q", name("L40S", 48, Q, None, None)),
            ("NVIDIA RTXA6000-24Q", name("RTXA6000", 24, Q, None, None)),
            ("T4-16C", name("T4", 16, C, None, None)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_nvidia_vgpu_name(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn series_letters_round_trip() {
        for s in [
            NvidiaSeries::A,
            NvidiaSeries::B,
            NvidiaSeries::C,
            NvidiaSeries::Q,
        ] {
            assert_eq!(NvidiaSeries::from_letter(s.letter()), Some(s));
        }
        assert_eq!(NvidiaSeries::from_letter('X'), None);
    }

    #[test]
    fn rejects() {
        for bad in [
            "",
            "GRID",
            "NVIDIA L40S",
            "NVIDIA L40S-",
            "NVIDIA L40S-Q",
            "NVIDIA L40S-4",
            "NVIDIA L40S-4X",
            "NVIDIA L40S-4q",
            "NVIDIA L40S-4Q4x",
            "NVIDIA -4Q",
            "NVIDIA A100-x-10C",
            "NVIDIA -1-10C",
            "GRID K120Q",
            "NVIDIA L40S-99999999999Q",
            "num_heads=4, frl_config=60",
        ] {
            let err = parse_nvidia_vgpu_name(bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    ParseError::Invalid {
                        what: "NVIDIA vGPU type name",
                        ..
                    }
                ),
                "{bad:?}: {err:?}"
            );
        }
    }
}

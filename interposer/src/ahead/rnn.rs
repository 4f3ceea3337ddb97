//! Where `cudnnGetRNNWeightParams` finds an RNN's matrices and biases, by what the RNN
//! descriptor says rather than by which descriptor it is. torch makes a new RNN descriptor
//! for every forward and backward and asks the address and shape of every matrix and bias
//! of every layer each time (two layers of an LSTM: 32 questions, one round trip each at
//! 70 ms). The answer depends on the descriptor's settings, the layer, the weight space's
//! size and which matrix is asked, and names the matrix as an offset into the weight space:
//! the same for a descriptor set alike, in this process or in a later one on the same
//! server identity (`crate::learned`).

use super::learned::Space;

/// A tensor descriptor as `cudnnGetTensorNdDescriptor` reported it (all its dimensions).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TensorNd {
    pub data_type: u32,
    pub dims: Vec<i32>,
    pub strides: Vec<i32>,
}

/// CUDNN_DIM_MAX: no tensor descriptor has more dimensions.
pub const DIM_MAX: usize = 8;

/// The question, without the descriptors' names: the RNN descriptor's fingerprint (what was
/// set on it, `crate::runtime::cudnn_sizes`), the pseudo-layer, the weight space's size, the
/// linear layer, and which of the four outputs (matrix descriptor and address, bias
/// descriptor and address) the caller passed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Question {
    pub rnn: u64,
    pub layer: i32,
    pub space_size: u64,
    pub lin: i32,
    /// Bits 0..4: mDesc, mAddr, bDesc, bAddr passed (not NULL).
    pub passed: u8,
}

impl Question {
    /// The key in the store of learned answers: this release (the fingerprint is a hash only
    /// it computes alike) and the question.
    pub fn stored(&self) -> Vec<u8> {
        format!(
            "{}|cudnnGetRNNWeightParams|{:016x}|{}|{}|{}|{}",
            env!("CARGO_PKG_VERSION"),
            self.rnn,
            self.layer,
            self.space_size,
            self.lin,
            self.passed
        )
        .into_bytes()
    }
}

/// The store's space of these answers.
pub const SPACE: Space = Space::RnnWeights;

/// A successful answer: where the matrix and the bias start, as offsets into the weight
/// space (None: not asked, or cuDNN wrote NULL: no such matrix), and what cuDNN filled the
/// descriptors with (None: not passed, or not described).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Weights {
    pub matrix: Option<u64>,
    pub bias: Option<u64>,
    pub matrix_nd: Option<TensorNd>,
    pub bias_nd: Option<TensorNd>,
}

impl Weights {
    /// The bytes kept on disk.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        for offset in [self.matrix, self.bias] {
            match offset {
                None => v.push(0),
                Some(o) => {
                    v.push(1);
                    v.extend_from_slice(&o.to_le_bytes());
                }
            }
        }
        for nd in [&self.matrix_nd, &self.bias_nd] {
            match nd {
                None => v.push(0),
                Some(t) => {
                    v.push(1);
                    v.extend_from_slice(&t.data_type.to_le_bytes());
                    v.push(t.dims.len() as u8);
                    for x in t.dims.iter().chain(&t.strides) {
                        v.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
        v
    }

    /// Bytes [`Weights::encode`] wrote; None for anything else (a store of another release
    /// or a damaged file is a miss, never an answer).
    pub fn decode(v: &[u8]) -> Option<Weights> {
        let mut rest = v;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = rest.split_at_checked(n)?;
            rest = tail;
            Some(head)
        };
        let mut offsets = [None, None];
        for o in &mut offsets {
            *o = match take(1)?[0] {
                0 => None,
                1 => Some(u64::from_le_bytes(take(8)?.try_into().ok()?)),
                _ => return None,
            };
        }
        let mut nds = [None, None];
        for nd in &mut nds {
            *nd = match take(1)?[0] {
                0 => None,
                1 => {
                    let data_type = u32::from_le_bytes(take(4)?.try_into().ok()?);
                    let n = usize::from(take(1)?[0]);
                    if n > DIM_MAX {
                        return None;
                    }
                    let mut ints = Vec::with_capacity(2 * n);
                    for _ in 0..2 * n {
                        ints.push(i32::from_le_bytes(take(4)?.try_into().ok()?));
                    }
                    let strides = ints.split_off(n);
                    Some(TensorNd { data_type, dims: ints, strides })
                }
                _ => return None,
            };
        }
        if !rest.is_empty() {
            return None;
        }
        let [matrix, bias] = offsets;
        let [matrix_nd, bias_nd] = nds;
        Some(Weights { matrix, bias, matrix_nd, bias_nd })
    }

    /// Whether this answer has what a caller passing `passed` needs: an offset or NULL for
    /// each address asked (always), and the shape of each descriptor passed.
    pub fn complete_for(&self, passed: u8) -> bool {
        (passed & 1 == 0 || self.matrix_nd.is_some()) && (passed & 4 == 0 || self.bias_nd.is_some())
    }
}

/// An address cuDNN wrote, as an offset into the weight space at `space` (NULL stays None).
pub fn offset(addr: u64, space: u64) -> Option<u64> {
    (addr != 0).then(|| addr.wrapping_sub(space))
}

/// The address an offset names in the weight space at `space` (None: NULL).
pub fn address(offset: Option<u64>, space: u64) -> u64 {
    offset.map_or(0, |o| space.wrapping_add(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nd(n: usize) -> TensorNd {
        TensorNd { data_type: 2, dims: (1..=n as i32).collect(), strides: (0..n as i32).rev().collect() }
    }

    #[test]
    fn weights_round_trip_through_their_bytes() {
        for w in [
            Weights::default(),
            Weights { matrix: Some(4096), bias: None, matrix_nd: Some(nd(3)), bias_nd: None },
            Weights { matrix: Some(0), bias: Some(u64::MAX), matrix_nd: Some(nd(0)), bias_nd: Some(nd(DIM_MAX)) },
        ] {
            assert_eq!(Weights::decode(&w.encode()), Some(w));
        }
    }

    #[test]
    fn damaged_bytes_are_no_answer() {
        let w = Weights { matrix: Some(64), bias: Some(128), matrix_nd: Some(nd(3)), bias_nd: Some(nd(3)) };
        let bytes = w.encode();
        for cut in 0..bytes.len() {
            assert_eq!(Weights::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Weights::decode(&longer), None);
        assert_eq!(Weights::decode(&[2]), None, "an unknown tag");
        let mut too_many = Weights { matrix_nd: Some(nd(1)), ..Weights::default() }.encode();
        too_many[7] = DIM_MAX as u8 + 1;
        assert_eq!(Weights::decode(&too_many), None, "more dimensions than cuDNN has");
    }

    #[test]
    fn addresses_are_offsets_into_the_weight_space() {
        let space = 0x7f00_0000_1000;
        assert_eq!(offset(space + 4096, space), Some(4096));
        assert_eq!(offset(0, space), None, "NULL: no such matrix");
        assert_eq!(address(Some(4096), 0x5000_0000), 0x5000_1000, "another process's weight space");
        assert_eq!(address(None, space), 0);
    }

    #[test]
    fn an_answer_serves_only_callers_whose_descriptors_it_described() {
        let w = Weights { matrix: Some(0), bias: None, matrix_nd: Some(nd(3)), bias_nd: None };
        assert!(w.complete_for(0b0011), "matrix descriptor and address");
        assert!(w.complete_for(0b0010), "the address alone");
        assert!(!w.complete_for(0b0111), "a bias descriptor it never filled");
    }

    #[test]
    fn questions_differ_in_the_store_by_every_part() {
        let q = Question { rnn: 7, layer: 1, space_size: 1 << 20, lin: 3, passed: 0b1111 };
        let others = [
            Question { rnn: 8, ..q },
            Question { layer: 0, ..q },
            Question { space_size: 1 << 21, ..q },
            Question { lin: 4, ..q },
            Question { passed: 0b0011, ..q },
        ];
        for o in others {
            assert_ne!(q.stored(), o.stored(), "{o:?}");
        }
    }
}

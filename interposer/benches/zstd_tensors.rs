//! Would zstd pay on the bytes programs copy to and from a GPU? Issue 19 asks to measure the
//! ratio on real tensors first: model weights, activations, token ids. No trained weights
//! can be downloaded here, so the tensors are made with the distributions that matter for
//! compression (what is left of a float after its sign and exponent is close to random):
//! weights N(0, 0.02) in fp16, bf16 and fp32; activations N(0, 1) and after a ReLU (half
//! zeros) in fp16; token ids below 32,000 as int64 and int32; zeros (optimizer state, a
//! fresh KV cache). Each is 64 MiB, compressed in the wire's 8 MiB chunks on one core, at
//! levels 1 and 3. Run with `cargo bench -p chidori-interposer --bench zstd_tensors`.

use std::time::Instant;

const BYTES: usize = 64 << 20;
const CHUNK: usize = 8 << 20;

/// A seeded xorshift generator and the normal variates Box–Muller makes of it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

/// IEEE half precision of `x` (round to nearest even; no NaN inputs here).
fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let mant = b & 0x7f_ffff;
    if exp >= 31 {
        return sign | 0x7c00;
    }
    if exp <= 0 {
        if exp < -10 {
            return sign;
        }
        // A subnormal half: the significand shifted down, rounded half up (close enough for
        // the few weights this small).
        let shift = (14 - exp) as u32;
        let half = ((mant | 0x80_0000) + (1 << (shift - 1))) >> shift;
        return sign | half as u16;
    }
    let mut out = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && out & 1 == 1) {
        out += 1;
    }
    sign | out as u16
}

/// bfloat16 of `x`: the top half of its bits, rounded to nearest even.
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn tensor(kind: &str, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(BYTES);
    while out.len() < BYTES {
        match kind {
            "weights fp16" => out.extend_from_slice(&f16_bits(0.02 * rng.normal()).to_le_bytes()),
            "weights bf16" => out.extend_from_slice(&bf16_bits(0.02 * rng.normal()).to_le_bytes()),
            "weights fp32" => out.extend_from_slice(&(0.02 * rng.normal()).to_le_bytes()),
            "activations fp16" => out.extend_from_slice(&f16_bits(rng.normal()).to_le_bytes()),
            "after ReLU fp16" => out.extend_from_slice(&f16_bits(rng.normal().max(0.0)).to_le_bytes()),
            "token ids int64" => out.extend_from_slice(&(rng.next() % 32_000).to_le_bytes()),
            "token ids int32" => out.extend_from_slice(&((rng.next() % 32_000) as u32).to_le_bytes()),
            _ => out.extend_from_slice(&[0u8; 4096]),
        }
    }
    out.truncate(BYTES);
    out
}

fn main() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let kinds = [
        "weights fp16",
        "weights bf16",
        "weights fp32",
        "activations fp16",
        "after ReLU fp16",
        "token ids int64",
        "token ids int32",
        "zeros",
    ];
    println!("| tensor (64 MiB) | level | ratio | compress MB/s | decompress MB/s |");
    println!("|---|---:|---:|---:|---:|");
    for kind in kinds {
        let data = tensor(kind, &mut rng);
        for level in [1, 3] {
            let start = Instant::now();
            let packed: Vec<Vec<u8>> =
                data.chunks(CHUNK).map(|c| zstd::bulk::compress(c, level).expect("compressing")).collect();
            let compress = start.elapsed().as_secs_f64();
            let start = Instant::now();
            let mut restored = 0usize;
            for p in &packed {
                restored += zstd::bulk::decompress(p, CHUNK).expect("decompressing").len();
            }
            let decompress = start.elapsed().as_secs_f64();
            assert_eq!(restored, data.len());
            let size: usize = packed.iter().map(Vec::len).sum();
            let mb = data.len() as f64 / 1e6;
            println!(
                "| {kind} | {level} | {:.3} | {:.0} | {:.0} |",
                data.len() as f64 / size as f64,
                mb / compress,
                mb / decompress
            );
        }
    }
}

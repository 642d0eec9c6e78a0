//! The DMA stream decoder on arbitrary bytes: `describe`, `describe_for_output`, `inspect`
//! and `decompress` return `CorruptDataError` (or `CapacityError` for a size the host cannot
//! hold), never panic, and agree with each other; a successful decode has exactly the declared
//! size. The input also seeds a valid stream (compressed with the codec and element size its
//! first byte picks) that is then mutated by the fuzzer's bytes, so the deep paths (block
//! table, codecs, checksum) are reached, not only the header checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trn2core::dma::{self, Codec};
use trn2core::Error;

fn check(stream: &[u8]) {
    let described = dma::describe(stream);
    let for_output = dma::describe_for_output(stream);
    let inspected = dma::inspect(stream);
    let decoded = dma::decompress(stream);
    for r in [&described, &for_output, &inspected] {
        if let Err(e) = r {
            assert!(matches!(e, Error::CorruptData { .. } | Error::Capacity { .. }), "{e:?}");
        }
    }
    match &decoded {
        Ok(d) => {
            // A stream that decodes passes every check, and holds what it declares.
            let info = inspected.as_ref().expect("decoded but inspect failed");
            assert_eq!(d.bytes.len() as u64, info.raw_nbytes);
            assert!(described.is_ok() && for_output.is_ok());
        }
        Err(e) => assert!(matches!(e, Error::CorruptData { .. } | Error::Capacity { .. }), "{e:?}"),
    }
    if described.is_err() {
        assert!(decoded.is_err(), "the header failed but the stream decoded");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // A valid stream of the data's own bytes, mutated by the data.
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let codec = [Codec::None, Codec::Zvc, Codec::BytePlane][usize::from(pick % 3)];
    let elem = [1usize, 2, 4, 8][usize::from(pick / 3 % 4)];
    let (payload, edits) = rest.split_at(rest.len() / 2);
    let n = payload.len() / elem * elem;
    let shape = [(n / elem) as u64];
    let Ok(mut stream) = dma::compress(&payload[..n], elem, codec, "uint8", &shape) else {
        return;
    };
    let whole = dma::decompress(&stream).expect("a fresh stream decodes");
    assert_eq!(whole.bytes, &payload[..n]);
    // Each three edit bytes: a position (two bytes) and a value to xor in.
    for e in edits.chunks_exact(3) {
        if stream.is_empty() {
            break;
        }
        let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % stream.len();
        stream[at] ^= e[2] | 1;
    }
    if !edits.is_empty() && edits.len() % 7 == 0 {
        stream.truncate(stream.len() * usize::from(edits[0]) / 256);
    }
    check(&stream);
    if let Ok(d) = dma::decompress(&stream) {
        // Altered but still decoding: only with a matching checksum, so the bytes must be
        // exactly what the stream says (a self-consistent forgery); never a wrong length.
        assert_eq!(d.bytes.len() as u64, dma::inspect(&stream).expect("ok").raw_nbytes);
    }
});

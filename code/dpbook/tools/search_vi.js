/*
 * Vietnamese search (dpbook.tools.search_vi). Sphinx puts this file into language_data.js, which
 * search.html loads after searchtools.js and before searchindex.js.
 *
 * The index holds folded words (no diacritics, đ as d, lower case) and the pairs of neighbouring
 * words ("bo_nho"). Here the query is folded the same way: each word in the Stemmer that
 * searchtools.js applies, and the whole query for the titles and index entries that
 * Search._performSearch compares with it, against folded copies made when the index loads (the
 * results then show the titles as written). A page that holds the query's words side by side
 * ranks above one that holds them apart (Scorer.score).
 */

const dpbFold = (text) => text.normalize("NFD").replace(/\p{M}/gu, "")
  .replace(/đ/g, "d").replace(/Đ/g, "D").toLowerCase().normalize("NFC");

var Stemmer = function () {
  this.stemWord = (word) => dpbFold(word);
};

// Letters with their combining marks (a query typed decomposed), digits and "_" (identifiers).
var splitQuery = (query) => query.normalize("NFC")
  .split(/[^\p{Letter}\p{Mark}\p{Number}_]+/gu)
  .filter((term) => term);

const DPB_PHRASE_BONUS = 20;

(() => {
  const folded = {};
  const original = { titles: new Map(), sections: new Map() };
  let pairs = [];

  const foldKeys = (table) => {
    const out = {};
    for (const [key, value] of Object.entries(table)) {
      const k = dpbFold(key);
      out[k] = (out[k] || []).concat(value);
    }
    return out;
  };

  const setIndex = Search.setIndex;
  Search.setIndex = (index) => {
    folded.titles = index.titles.map(dpbFold);
    folded.alltitles = foldKeys(index.alltitles);
    folded.indexentries = foldKeys(index.indexentries);
    folded.docs = new Map(index.docnames.map((name, i) => [name, i]));
    index.titles.forEach((title, i) => original.titles.set(i, title));
    for (const [title, places] of Object.entries(index.alltitles))
      for (const [file] of places) original.sections.set(`${file}\u0000${dpbFold(title)}`, title);
    setIndex(index);
  };

  const hasPair = (pair, file) => [Search._index.terms[pair], Search._index.titleterms[pair]]
    .some((files) => files === file || (Array.isArray(files) && files.includes(file)));

  // Titles in a result were built from the folded copies: show them as written.
  const unfold = (result) => {
    const file = folded.docs.get(result[0]);
    const title = original.titles.get(file);
    const parts = result[1].split(" > ");
    if (parts[0] === folded.titles[file]) parts[0] = title;
    if (parts.length > 1)
      parts[1] = original.sections.get(`${file}\u0000${parts[1]}`) || parts[1];
    result[1] = parts.join(" > ");
    if (result[3] && result[3].endsWith(folded.titles[file]))
      result[3] = result[3].slice(0, -folded.titles[file].length) + title;
    return result;
  };

  Scorer.score = (result) => {
    if (!pairs.length) return result[4];
    const file = folded.docs.get(result[0]);
    const found = pairs.filter((pair) => hasPair(pair, file)).length;
    return result[4] + Math.round(DPB_PHRASE_BONUS * found / pairs.length);
  };

  const performSearch = Search._performSearch;
  Search._performSearch = (query, searchTerms, excludedTerms, highlightTerms, objectTerms) => {
    const words = splitQuery(query).map(dpbFold);
    pairs = words.slice(1).map((word, i) => `${words[i]}_${word}`);
    const index = Search._index;
    const kept = [index.titles, index.alltitles, index.indexentries];
    [index.titles, index.alltitles, index.indexentries] =
      [folded.titles, folded.alltitles, folded.indexentries];
    try {
      return performSearch(dpbFold(query), searchTerms, excludedTerms, highlightTerms,
        new Set([...objectTerms].map(dpbFold))).map(unfold);
    } finally {
      [index.titles, index.alltitles, index.indexentries] = kept;
    }
  };
})();

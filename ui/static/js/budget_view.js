// Budgets by period (bars) and group rate rules (in words), as the keys
// page, the dashboard and the account page show them
// (relay/money/budgets.py, relay/money/rates.py).
import { t } from './i18n.js';
import { el, credits, num } from './ui.js';

export const PERIODS = ['day', 'week', 'month'];

/** One bar per budget: "Today: $1.20 of $5.00", its progress, and when it starts again. */
export function budgetBars(use) {
  return (use || []).map((b) => {
    const share = b.limit ? Math.min(b.used / b.limit, 1) : 0;
    const level = share >= 1 ? 'full' : share >= 0.8 ? 'high' : 'ok';
    const label = t('budget.bar', { period: t(`budget.period.${b.period}`), used: credits(b.used), limit: credits(b.limit) });
    return el('div', { class: `budget ${level}`, dataset: { period: b.period } },
      el('span', { class: 'budget-label' }, label),
      el('progress', { max: String(b.limit), value: String(Math.min(b.used, b.limit)), 'aria-label': label }));
  });
}

/** A group's rate rule in words: its rate, each tier, and the rate that applies to the viewer now. */
export function ruleWords(g) {
  const parts = [t('groups.rule_flat', { rate: g.rate })];
  for (const tier of g.input_tiers || []) {
    parts.push(t('groups.rule_input', { rate: num(g.rate * tier.factor), tokens: num(tier.from) }));
  }
  for (const tier of g.spend_tiers || []) {
    parts.push(t('groups.rule_spend', { rate: num(g.rate * tier.factor), amount: credits(tier.from * 500000) }));
  }
  if (g.rate_now !== undefined && ((g.input_tiers || []).length || (g.spend_tiers || []).length)) {
    parts.push(t('groups.rate_now', { rate: num(g.rate_now) }));
  }
  return parts.join(t('groups.sep'));
}
